"""`amux alerts list|explain <incident|firing>|ack|snooze|unsnooze|pause` and `amux feishu recheck --app APP_ID`
over REST."""
from __future__ import annotations

import argparse

from ..domain.alerts import parse_duration
from .client import client
from .options import client_opts, emit


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `amux alerts …` and `amux feishu …`."""
    al = subparsers.add_parser("alerts", help="the alert center: incidents, decisions, delivery diagnostics")
    sub = al.add_subparsers(dest="alerts_cmd", required=True)
    ls = sub.add_parser("list", help="active incidents and delivery diagnostics")
    client_opts(ls)
    ls.add_argument("--all", action="store_true", help="closed incidents too")
    ex = sub.add_parser("explain", help="why an outcome did or did not produce a notice")
    client_opts(ex)
    ex.add_argument("ref", help="an incident id (inc_…) or a firing id (fir_…)")
    helps = {"ack": "acknowledge an incident: no more reminders; its card shows who, when and the comment",
             "snooze": "hold an incident's reminders for a while (default alerts.snooze_s, 24 h)",
             "unsnooze": "lift an incident's snooze: reminders resume",
             "pause": "pause an incident's schedule (future dispatch only)"}
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text)
        client_opts(p)
        p.add_argument("id", help="the incident id (inc_…), from `amux alerts list`")
        if name == "ack":
            p.add_argument("--comment", help="what to say with the acknowledgement (shown on the card)")
        elif name == "snooze":
            p.add_argument("--for", dest="for_s", type=_duration, metavar="DURATION",
                           help="how long: 30m, 4h, 1d, 1h30m or seconds (default: alerts.snooze_s, 24 h)")
    fs = subparsers.add_parser("feishu", help="Feishu delivery")
    fsub = fs.add_subparsers(dest="feishu_cmd", required=True)
    rc = fsub.add_parser("recheck", help="lift a delivery suspension (230013/230053) after fixing it")
    client_opts(rc)
    rc.add_argument("--app", required=True, help="the application's app_id")


async def run(args: argparse.Namespace) -> None:
    """Run one `amux alerts` / `amux feishu` command."""
    api = client(args)
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
                 f"unknown={i['unknowns']}"
                 + (f" acked_by={i.get('acked_by') or '?'}" if i.get("acked_at") else "")
                 + (f" snoozed_until={i['snoozed_until']}" if i.get("snoozed_until") else "")
                 for i in res["incidents"]]
        lines += [f"diagnostic: {d}" for d in res["diagnostics"]]
        emit(args, res, "\n".join(lines) or "no active incidents")
    else:
        body = {}
        if getattr(args, "comment", None):
            body["comment"] = args.comment
        if getattr(args, "for_s", None):
            body["for_s"] = args.for_s
        res = await api.call("POST", f"alerts/incidents/{args.id}/{args.alerts_cmd}", body=body)
        emit(args, res, _control_line(res))


def _control_line(res: dict) -> str:
    line = f"{res['id']}  {res['state']}"
    if res.get("acked_at"):
        line += f"  acknowledged by {res.get('acked_by') or '?'} at {res['acked_at']}"
        line += f": {res['ack_comment']}" if res.get("ack_comment") else ""
    if res.get("snoozed_until"):
        line += f"  snoozed until {res['snoozed_until']}"
    return line
