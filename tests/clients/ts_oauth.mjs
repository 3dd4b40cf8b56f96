// The TypeScript SDK's own OAuth client provider against the hub, end to end: 401 → discovery → dynamic
// registration → authorization with PKCE (the "user" approves on the hub's page with an amux token) →
// finishAuth → MCP calls with the access token → a refresh. Prints one JSON report on stdout.
//
//   node ts_oauth.mjs MCP_URL AMUX_TOKEN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const [mcpUrl, amuxToken] = process.argv.slice(2);
const REDIRECT = "http://127.0.0.1:33419/callback";
const report = { steps: [], errors: [] };

class MemoryProvider {
  constructor() { this._tokens = undefined; this._client = undefined; this._verifier = undefined; this.authorizationUrl = undefined; }
  get redirectUrl() { return REDIRECT; }
  get clientMetadata() {
    return { client_name: "ts-oauth", redirect_uris: [REDIRECT], grant_types: ["authorization_code", "refresh_token"],
             response_types: ["code"], token_endpoint_auth_method: "client_secret_basic" };
  }
  clientInformation() { return this._client; }
  saveClientInformation(info) { this._client = info; report.steps.push("registered"); }
  tokens() { return this._tokens; }
  saveTokens(tokens) { this._tokens = tokens; report.steps.push("tokens"); }
  redirectToAuthorization(url) { this.authorizationUrl = url; report.steps.push("redirect"); }
  saveCodeVerifier(v) { this._verifier = v; }
  codeVerifier() { return this._verifier; }
}

// What the person does in their browser: open the approval page, sign in with an amux token, approve.
async function approve(authorizationUrl) {
  const page = await (await fetch(authorizationUrl)).text();
  const form = new URLSearchParams();
  for (const [, name, value] of page.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)) {
    form.append(unescape(name), unescape(value));
  }
  for (const [, scope] of page.matchAll(/name="grant" value="(\w+)"/g)) form.append("grant", scope);
  form.append("token", amuxToken);
  form.append("decision", "approve");
  const base = new URL(authorizationUrl).origin;
  const resp = await fetch(`${base}/oauth/authorize`, { method: "POST", body: form, redirect: "manual" });
  const location = resp.headers.get("location");
  if (!location || !location.startsWith(REDIRECT)) throw new Error(`approval did not redirect back: ${resp.status}`);
  return new URL(location).searchParams.get("code");
}

function unescape(s) {
  return s.replace(/&quot;/g, '"').replace(/&#x27;/g, "'").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");
}

const provider = new MemoryProvider();
let transport = new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: provider });
let client = new Client({ name: "ts-oauth", version: "1.0.0" }, { capabilities: {} });
try {
  try {
    await client.connect(transport);
    report.errors.push("connected without authorization");
  } catch (e) {
    if (!(e instanceof UnauthorizedError)) throw e;
    report.steps.push("unauthorized");
  }
  const code = await approve(provider.authorizationUrl);
  await transport.finishAuth(code);
  transport = new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: provider });
  client = new Client({ name: "ts-oauth", version: "1.0.0" }, { capabilities: {} });
  await client.connect(transport);
  report.steps.push("connected");
  const { tools } = await client.listTools();
  report.tools = tools.length;
  const profiles = await client.callTool({ name: "profile_list", arguments: {} });
  report.profiles = profiles.isError ? null : profiles.structuredContent.profiles.length;
  const lease = await client.callTool({ name: "rift_task_new", arguments: { name: "oauth" } });
  report.holder = lease.isError ? lease.content[0].text : lease.structuredContent.holder;
  report.scope = provider.tokens().scope;
  report.hasRefresh = Boolean(provider.tokens().refresh_token);
  await client.close();
} catch (e) {
  report.errors.push(`${e.name}: ${e.message}`);
}
console.log(JSON.stringify(report));
