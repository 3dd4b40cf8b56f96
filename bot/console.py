"""`GET /console`: try the bot without a Feishu tenant.

Pick a simulated Feishu user of a configured application, type `/amux` or a message, see the cards
rendered as HTML and click their buttons. A message's Turn shows as its progress card, polled from the outbox
(`/console/api/chat`) and re-rendered as it changes until it is the answer; Stop and question cards work on it.
Every request is turned into the same event envelope Feishu
sends (`im.message.receive_v1`, `card.action.trigger`) and goes through `FeishuBot.accept` — the same
deduplication, identity binding, handlers and authorization; only the transport differs. Replies are
collected instead of sent. The console's API needs an administrator token (it can act as any user),
and when no application is configured it offers a local one, `cli_console`, whose administrator is
`ou_admin`; the alert center knows that application from the hub's start, so its delivery state and
Recheck answer for it like for a configured one.
"""
from __future__ import annotations

import json
import secrets
import uuid
from typing import TYPE_CHECKING

from aiohttp import web

from hub.config import FeishuAppSettings
from hub.errors import AmuxError
from hub.services.alerts.channel import CONSOLE_APP

if TYPE_CHECKING:
    from .core import FeishuBot
    from .services import BotServices

HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"}


class ConsoleSink:
    """An Outgoing that keeps the bot's replies for the browser."""

    def __init__(self) -> None:
        self.replies: list[dict] = []
        self.patches: list[dict] = []

    async def reply(self, app_id: str, message_id: str, msg_type: str, content: dict, uuid_: str) -> str | None:
        """Keep a reply; return a message id like Feishu would."""
        mid = f"om_console_{secrets.token_hex(6)}"
        self.replies.append({"message_id": mid, "reply_to": message_id, "msg_type": msg_type, "content": content})
        return mid

    async def patch(self, app_id: str, message_id: str, card: dict) -> bool:
        """Keep a late card update."""
        self.patches.append({"message_id": message_id, "card": card})
        return True

    async def send(self, app_id: str, open_id: str, msg_type: str, content: dict, uuid_: str) -> str | None:
        """Keep a private message to one user (the console shows it like a reply)."""
        mid = f"om_console_{secrets.token_hex(6)}"
        self.replies.append({"message_id": mid, "to": open_id, "msg_type": msg_type, "content": content})
        return mid


def _envelope(app_id: str, event_type: str, event: dict, now_ms: int) -> dict:
    return {"schema": "2.0", "header": {"event_id": f"console-{uuid.uuid4().hex}", "event_type": event_type,
                                        "app_id": app_id, "tenant_key": "console", "create_time": str(now_ms)},
            "event": event}


class Console:
    """The console's page and JSON API."""

    def __init__(self, bot: FeishuBot, services: BotServices) -> None:
        self.bot = bot
        self.services = services
        self.local: FeishuAppSettings | None = None
        if not bot.apps:
            self.local = bot.apps[CONSOLE_APP] = FeishuAppSettings(app_id=CONSOLE_APP, admin_open_id="ou_admin",
                                                                   mode="console")

    async def start(self, _app: web.Application) -> None:
        """Make the console's own application known to the alert center (its Recheck then has a real answer)."""
        if self.local is not None:
            await self.services.alerts.add_local_app(self.local.app_id, self.local.admin_open_id or "",
                                                     self.local.timezone)

    async def _admin(self, request: web.Request) -> None:
        caller = await self.services.auth.authenticate(request.headers.get("Authorization"))
        if not caller.admin:
            raise web.HTTPForbidden(text="the console acts as any Feishu user: use an administrator token "
                                         "($AMUX_HOME/admin.token or `amux token create --admin`)")

    async def _json(self, request: web.Request) -> dict:
        try:
            await self._admin(request)
        except AmuxError as e:
            raise web.HTTPUnauthorized(text=e.message) from None
        try:
            data = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="send a JSON object") from None
        app_id, open_id = data.get("app_id"), data.get("open_id")
        if app_id not in self.bot.apps:
            raise web.HTTPBadRequest(text=f"unknown application {app_id!r}; pick one of {sorted(self.bot.apps)}")
        if not isinstance(open_id, str) or not open_id.startswith("ou_") or len(open_id) > 100:
            raise web.HTTPBadRequest(text="open_id must look like ou_…")
        return data

    def _now_ms(self) -> int:
        return int(self.services.clock.now().timestamp() * 1000)

    async def page(self, request: web.Request) -> web.Response:
        """Serve the console page."""
        nonce = secrets.token_urlsafe(16)
        csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
               "form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
        return web.Response(text=PAGE.replace("__NONCE__", nonce), content_type="text/html",
                            headers={**HEADERS, "Content-Security-Policy": csp})

    async def apps(self, request: web.Request) -> web.Response:
        """List the applications and their administrators (for the user picker)."""
        try:
            await self._admin(request)
        except AmuxError as e:
            raise web.HTTPUnauthorized(text=e.message) from None
        return web.json_response([{"app_id": a.app_id, "admin_open_id": a.admin_open_id}
                                  for a in self.bot.apps.values()],
                                 headers=HEADERS)

    async def message(self, request: web.Request) -> web.Response:
        """Deliver a chat message as `im.message.receive_v1`; return the bot's replies."""
        data = await self._json(request)
        text = str(data.get("text") or "")[:4000]
        mid = f"om_console_{secrets.token_hex(6)}"
        event = {"sender": {"sender_id": {"open_id": data["open_id"]}, "sender_type": "user", "tenant_key": "console"},
                 "message": {"message_id": mid, "chat_id": f"oc_console_{data['open_id']}", "chat_type": "p2p",
                             "message_type": "text", "content": json.dumps({"text": text}),
                             "create_time": str(self._now_ms())}}
        sink = ConsoleSink()
        _answer, work = await self.bot.accept(data["app_id"], _envelope(data["app_id"], "im.message.receive_v1", event,
                                                                       self._now_ms()), sink)
        if work is not None:
            await work
        return web.json_response({"replies": sink.replies}, headers=HEADERS)

    async def chat(self, request: web.Request) -> web.Response:
        """Return what the console user's chat shows: each progress card as last updated, the answer's parts and
        refusals — the chat outputs the outbox holds (the console's own application has no channel to send them)."""
        data = await self._json(request)
        viewer = await self.bot.viewer_of(data["app_id"], data["open_id"])
        if viewer is None:
            return web.json_response({"outputs": []}, headers=HEADERS)
        outputs = await self.services.chats.outputs(data["app_id"], f"oc_console_{data['open_id']}",
                                                    viewer.principal_id, data["open_id"])
        return web.json_response({"outputs": outputs}, headers=HEADERS)

    async def action(self, request: web.Request) -> web.Response:
        """Deliver a button click as `card.action.trigger` (a form's submit button with its `form_value`, as Feishu
        sends it); return the toast and/or the refreshed card."""
        data = await self._json(request)
        event = {"operator": {"open_id": data["open_id"], "tenant_key": "console"},
                 "token": f"c-{uuid.uuid4().hex}", "action": {"value": data.get("value"), "tag": "button"},
                 **({"action": {"value": data.get("value"), "tag": "button", "name": "submit",
                                "form_value": data["form_value"]}} if isinstance(data.get("form_value"), dict) else {}),
                 "host": "im_message", "context": {"open_message_id": str(data.get("message_id") or ""),
                                                   "open_chat_id": f"oc_console_{data['open_id']}"}}
        sink = ConsoleSink()
        answer, _work = await self.bot.accept(data["app_id"], _envelope(data["app_id"], "card.action.trigger", event,
                                                                        self._now_ms()), sink)
        return web.json_response(answer, headers=HEADERS)


def add_routes(app: web.Application, bot: FeishuBot, services: BotServices) -> None:
    """Mount `/console` and its API."""
    c = Console(bot, services)
    app.on_startup.append(c.start)
    app.router.add_get("/console", c.page)
    app.router.add_get("/console/api/apps", c.apps)
    app.router.add_post("/console/api/message", c.message)
    app.router.add_post("/console/api/action", c.action)
    app.router.add_post("/console/api/chat", c.chat)


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>amux bot console</title>
<style nonce="__NONCE__">
body{font:14px/1.45 system-ui,sans-serif;margin:1.5rem;color:#1d1d1f;max-width:60rem}
h1{font-size:1.3rem}fieldset{border:1px solid #e3e3e6;border-radius:6px;margin:0 0 1rem}
label{margin-right:1rem}input,select{font:inherit;padding:.2rem .4rem}
#log{display:flex;flex-direction:column;gap:.8rem}
.me{align-self:flex-end;background:#e8f0fe;padding:.4rem .7rem;border-radius:8px}
.card{border:1px solid #d0d0d5;border-radius:8px;overflow:hidden;max-width:36rem}
.card header{padding:.5rem .8rem;color:#fff;font-weight:600;background:#3370ff}
.card header.orange{background:#f80}.card header.grey{background:#8f959e}
.card .body{padding:.6rem .8rem}.md{margin:.3rem 0}.md p{white-space:pre-wrap;margin:.2rem 0}
.md ul,.md ol{margin:.2rem 0;padding-left:1.4rem}
.md code{font:12px ui-monospace,monospace;background:#f2f3f5;padding:0 .2rem;border-radius:3px}
.md pre{background:#f2f3f5;padding:.5rem;border-radius:6px;overflow:auto}.md pre code{background:none;padding:0}
.row{display:flex;gap:.4rem;flex-wrap:wrap;margin:.4rem 0}
button.primary{background:#3370ff;color:#fff;border:1px solid #3370ff}button.danger{color:#d83931}
button{font:inherit;padding:.25rem .7rem;border-radius:6px;border:1px solid #c9c9ce;background:#fff;cursor:pointer}
.text{background:#f5f5f7;padding:.4rem .7rem;border-radius:8px;white-space:pre-wrap;max-width:36rem}
#toast{position:fixed;top:1rem;right:1rem;padding:.5rem .9rem;border-radius:6px;
background:#1d1d1f;color:#fff;display:none}
.form label.field{display:flex;flex-direction:column;margin:.3rem 0}.form textarea{font:inherit}
#toast.error{background:#d83931}#toast.warning{background:#f80}
</style></head><body>
<h1>amux bot console</h1>
<p>Talk to the bot as a simulated Feishu user. Messages and clicks go through the same handlers and authorization as
real Feishu events.</p>
<fieldset><legend>Who</legend>
<label>Admin token <input id="token" type="password" size="30" autocomplete="off"></label>
<label>Application <select id="app"></select></label>
<label>User open_id <input id="user" value="ou_console_user" size="18"></label>
<label>Language <select id="lang"><option value="en_us">English</option>
<option value="zh_cn">简体中文</option></select></label>
<button id="connect">Connect</button>
</fieldset>
<form id="send"><input id="text" size="50" placeholder="/amux or any message">
<button id="sendbtn" type="submit">Send</button></form>
<div id="log"></div><div id="toast" role="status"></div>
<script nonce="__NONCE__">
const $ = (id) => document.getElementById(id);
const log = $("log");
function headers(){ return {"Content-Type":"application/json","Authorization":"Bearer "+$("token").value.trim()}; }
function say(text, cls){ const d=document.createElement("div"); d.className=cls;
  d.textContent=text; log.appendChild(d); return d; }
function toast(t){ if(!t) return; const el=$("toast"); const lang=$("lang").value;
  el.textContent=(t.i18n&&t.i18n[lang])||t.content; el.className=t.type; el.style.display="block";
  clearTimeout(el._t); el._t=setTimeout(()=>{el.style.display="none";}, 4000); }
function txt(node){ const lang=$("lang").value; return (node.i18n_content&&node.i18n_content[lang])||node.content||""; }
// Card markdown as Feishu renders it: **bold**, *italic*, ~~strike~~, `code`, ```fenced``` blocks, [links](url)
// (http/https only: applink.feishu.cn links are https; any other target stays text), "- " / "1. " lists and
// mentions (<at id=ou_…></at> → @ou_…).
// Nodes are built with textContent only, never innerHTML: user text (escaped by the bot with "\") stays text.
const MD_ESC="\\`*~[]()<>#|";
function el(tag, cls){ const e=document.createElement(tag); if(cls) e.className=cls; return e; }
function toks(s){ const t=[]; for(let i=0;i<s.length;i++){ const c=s[i];
  if(c==="\\"&&i+1<s.length&&MD_ESC.includes(s[i+1])){ t.push({c:s[i+1],lit:true}); i++; }
  else t.push({c:c,lit:false}); } return t; }
function find(t, from, end, d){ // the first unescaped `d` in t[from, end)
  outer: for(let i=from;i+d.length<=end;i++){
    for(let k=0;k<d.length;k++) if(t[i+k].lit||t[i+k].c!==d[k]) continue outer;
    return i; } return -1; }
function plainOf(t, a, b){ return t.slice(a,b).map(x=>x.c).join(""); }
function safeUrl(u){ try{ const x=new URL(u.trim()); if(x.protocol==="http:"||x.protocol==="https:") return x.href; }
  catch(e){} return null; }
function at(t, i, d){ return find(t, i, i+d.length, d)===i; }
function inline(parent, t, a, b){
  let buf=""; const flush=()=>{ if(buf){ parent.appendChild(document.createTextNode(buf)); buf=""; } };
  const wrap=(tag, d, i)=>{ const j=find(t, i+d.length, b, d); if(j<=i+d.length) return -1;
    flush(); const e=el(tag); inline(e, t, i+d.length, j); parent.appendChild(e); return j+d.length; };
  for(let i=a;i<b;){
    let next=-1;
    if(!t[i].lit){
      if(at(t,i,"`")){ const j=find(t, i+1, b, "`");
        if(j>i+1){ flush(); const c=el("code"); c.textContent=plainOf(t,i+1,j); parent.appendChild(c); next=j+1; } }
      else if(at(t,i,"<at id=")){ const j=find(t, i+7, b, "></at>"); // a mention, as Feishu shows it: @open_id
        if(j>i+7){ flush(); const m=el("span","at"); m.textContent="@"+plainOf(t,i+7,j); parent.appendChild(m);
          next=j+6; } }
      else if(at(t,i,"**")) next=wrap("strong","**",i);
      else if(at(t,i,"~~")) next=wrap("del","~~",i);
      else if(at(t,i,"*")) next=wrap("em","*",i);
      else if(at(t,i,"[")){ const j=find(t, i+1, b, "](");
        const k=j<0?-1:find(t, j+2, b, ")"); const href=k<0?null:safeUrl(plainOf(t,j+2,k));
        if(href){ flush(); const link=el("a"); link.href=href; link.rel="noopener noreferrer"; link.target="_blank";
          inline(link, t, i+1, j); parent.appendChild(link); next=k+1; } } }
    if(next<0){ buf+=t[i].c; i++; } else i=next; }
  flush(); }
function inlineInto(parent, s){ const t=toks(s); inline(parent, t, 0, t.length); }
const LIST=/^\s*(?:([-*])|(\d{1,9})\.)\s+(.*)$/;
function mdInto(parent, text){
  const box=el("div","md"); const lines=text.split("\n"); let para=null, list=null;
  const end=()=>{ para=null; list=null; };
  for(let i=0;i<lines.length;i++){
    const line=lines[i];
    if(/^\s*```/.test(line)){ end(); const pre=el("pre"); const code=el("code"); const body=[];
      for(i++; i<lines.length&&!/^\s*```\s*$/.test(lines[i]); i++) body.push(lines[i]);
      code.textContent=body.join("\n"); pre.appendChild(code); box.appendChild(pre); continue; }
    const m=LIST.exec(line);
    if(m){ const tag=m[1]?"ul":"ol"; para=null;
      if(!list||list.tagName.toLowerCase()!==tag){
        list=el(tag); if(m[2]) list.start=Number(m[2]); box.appendChild(list); }
      const li=el("li"); inlineInto(li, m[3]); list.appendChild(li); continue; }
    list=null;
    if(!para){ para=el("p"); box.appendChild(para); } else para.appendChild(document.createTextNode("\n"));
    inlineInto(para, line); }
  parent.appendChild(box); }
function renderInto(box, card, messageId){
  box.replaceChildren(); box.card=card; box.messageId=messageId;
  const h=document.createElement("header"); h.textContent=txt(card.header.title);
  h.className=card.header.template||""; box.appendChild(h);
  const body=document.createElement("div"); body.className="body"; box.appendChild(body);
  for(const el of card.body.elements){
    if(el.tag==="markdown") mdInto(body, txt(el));
    else if(el.tag==="hr") body.appendChild(document.createElement("hr"));
    else if(el.tag==="column_set"){ const row=document.createElement("div"); row.className="row";
      for(const col of el.columns) for(const b of col.elements) if(b.tag==="button"){
        const btn=document.createElement("button"); btn.textContent=txt(b.text); btn.className=b.type||"";
        btn.addEventListener("click", ()=>press(box, b.behaviors[0].value)); row.appendChild(btn); }
      body.appendChild(row); }
    else if(el.tag==="form") formInto(body, box, el); } }
// A Card JSON 2.0 form: inputs and select_static by `name`; the submit button posts every value as form_value.
function formInto(body, box, form){
  const f=document.createElement("div"); f.className="form"; const fields={};
  for(const it of form.elements){
    if(it.tag==="markdown"){ mdInto(f, txt(it)); continue; }
    if(it.tag==="input"||it.tag==="select_static"){
      const lab=document.createElement("label"); lab.className="field";
      lab.appendChild(document.createTextNode(txt(it.label||it.placeholder||{content:it.name})));
      let inp;
      if(it.tag==="select_static"){ inp=document.createElement("select");
        for(const o of it.options){ const op=document.createElement("option"); op.value=o.value;
          op.textContent=txt(o.text); if(o.value===it.initial_option) op.selected=true; inp.appendChild(op); } }
      else { inp=document.createElement(it.input_type==="multiline_text"?"textarea":"input");
        if(it.rows) inp.rows=it.rows; inp.value=it.default_value||""; inp.placeholder=txt(it.placeholder||{});
        if(it.max_length) inp.maxLength=it.max_length; }
      inp.name=it.name; fields[it.name]=inp; lab.appendChild(inp); f.appendChild(lab); continue; }
    if(it.tag==="button"){ const btn=document.createElement("button"); btn.textContent=txt(it.text);
      btn.className=it.type||"";
      btn.addEventListener("click", ()=>{ const values={};
        for(const k in fields) values[k]=fields[k].value;
        press(box, it.behaviors[0].value, it.form_action_type==="submit"?values:undefined); });
      f.appendChild(btn); } }
  body.appendChild(f); }
function cardBox(card, messageId){ const box=document.createElement("div"); box.className="card";
  renderInto(box, card, messageId); log.appendChild(box); return box; }
async function post(path, data){
  const r=await fetch(path,{method:"POST",headers:headers(),
    body:JSON.stringify(Object.assign({app_id:$("app").value,open_id:$("user").value.trim()},data))});
  if(!r.ok){ toast({type:"error",content:await r.text()}); return null; } return r.json(); }
async function press(box, value, formValue){
  const data={value:value,message_id:box.messageId}; if(formValue) data.form_value=formValue;
  const res=await post("/console/api/action",data); if(!res) return;
  toast(res.toast); if(res.card&&res.card.data) renderInto(box, res.card.data, box.messageId); }
$("send").addEventListener("submit", async (e)=>{ e.preventDefault();
  const text=$("text").value; if(!text.trim()) return;
  say(text,"me"); $("text").value="";
  const res=await post("/console/api/message",{text:text}); if(!res) return;
  for(const r of res.replies){
    if(r.msg_type==="interactive") cardBox(r.content, r.message_id); else say(r.content.text,"text"); }
  follow(); });
// The chat's outputs go through the hub's outbox: poll them and show each card as last updated (progress → answer).
const shown={}; let following=null;
async function follow(){ if(following) clearInterval(following); let left=240;
  following=setInterval(async ()=>{ if(--left<0){ clearInterval(following); return; }
    const res=await post("/console/api/chat",{}); if(!res) return;
    for(const o of res.outputs){ const key=JSON.stringify(o.card);
      if(!shown[o.id]) shown[o.id]={box:cardBox(o.card, o.id), key:key};
      else if(shown[o.id].key!==key){ shown[o.id].key=key; renderInto(shown[o.id].box, o.card, o.id); } } }, 700); }
$("connect").addEventListener("click", async ()=>{
  const r=await fetch("/console/api/apps",{headers:headers()});
  if(!r.ok){ toast({type:"error",content:await r.text()}); return; }
  const apps=await r.json(); const sel=$("app"); sel.replaceChildren();
  for(const a of apps){ const o=document.createElement("option"); o.value=a.app_id;
    o.textContent=a.app_id+(a.admin_open_id?" (admin "+a.admin_open_id+")":""); sel.appendChild(o); }
  toast({type:"success",content:"connected"}); });
$("lang").addEventListener("change", ()=>{
  for(const box of document.querySelectorAll(".card")) renderInto(box, box.card, box.messageId); });
</script></body></html>
"""
