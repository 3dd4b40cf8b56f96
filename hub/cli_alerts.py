"""`amux alerts list|explain <incident|firing>|ack|snooze|pause` and `amux feishu recheck --app APP_ID` over REST."""
from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction, client_opts) -> None:  # noqa: ANN001
    """Add `amux alerts …` and `amux feishu …`; `client_opts` adds --hub/--token/--json."""
    al = subparsers.add_parser("alerts", help="the alert center: incidents, decisions, delivery diagnostics")
    sub = al.add_subparsers(dest="alerts_cmd", required=True)
    ls = sub.add_parser("list", help="active incidents and delivery diagnostics")
    client_opts(ls)
    ls.add_argument("--all", action="store_true", help="closed incidents too")
    ex = sub.add_parser("explain", help="why an outcome did or did not produce a notice")
    client_opts(ex)
    ex.add_argument("ref", help="an incident id (inc_…) or a firing id (fir_…)")
    for name, text in (("ack", "acknowledge an incident"), ("snooze", "snooze an incident's notices for 24 h"),
                       ("pause", "pause an incident's schedule (future dispatch only)")):
        p = sub.add_parser(name, help=text)
        client_opts(p)
        p.add_argument("id", help="the incident id (inc_…)")
    fs = subparsers.add_parser("feishu", help="Feishu delivery")
    fsub = fs.add_subparsers(dest="feishu_cmd", required=True)
    rc = fsub.add_parser("recheck", help="lift a delivery suspension (230013/230053) after fixing it")
    client_opts(rc)
    rc.add_argument("--app", required=True, help="the application's app_id")


async def run(args: argparse.Namespace, api, emit) -> None:  # noqa: ANN001
    """Run one `amux alerts` / `amux feishu` command with the REST client `api`; `emit(args, data, human)` prints."""
    if args.cmd == "feishu":
        res = await api.call("POST", f"feishu/apps/{args.app}/recheck")
        emit(args, res, f"{res['app_id']}: delivery {res['delivery_state']}; {res['pending']} pending notices due now"
             + (f"\n{res['diagnostic']}" if res.get("diagnostic") else ""))
    elif args.alerts_cmd == "explain":
        res = await api.call("GET", f"alerts/explain/{args.ref}")
        lines = [f"{d['at']}  {d['decision']:<15} {d['detail'] or ''}"
                 + "".join(f"  {k}={d[k]}" for k in ("outcome", "firing_id", "incident_id", "notice_id") if d.get(k))
                 for d in res["decisions"]]
        emit(args, res, "\n".join(lines))
    elif args.alerts_cmd == "list":
        res = await api.call("GET", "alerts", params={"all": "1"} if args.all else None)
        lines = [f"{i['id']}  {i['state']:<10} schedule={i['schedule_id']} failures={i['failures']} "
                 f"missed={i['missed']} "
                 f"unknown={i['unknowns']}" for i in res["incidents"]]
        lines += [f"diagnostic: {d}" for d in res["diagnostics"]]
        emit(args, res, "\n".join(lines) or "no active incidents")
    else:
        res = await api.call("POST", f"alerts/incidents/{args.id}/{args.alerts_cmd}")
        emit(args, res, f"{res['id']}  {res['state']}")
