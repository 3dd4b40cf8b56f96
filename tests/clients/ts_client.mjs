// The official TypeScript MCP SDK against a live hub: one initialize per protocol version the SDK supports,
// every tool listed and its schemas checked, then real calls. Prints one JSON report on stdout.
//
//   node ts_client.mjs URL TOKEN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { SUPPORTED_PROTOCOL_VERSIONS } from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const report = { versions: {}, tools: {}, calls: {}, errors: [] };

function transportFor(version) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const send = transport.send.bind(transport);
  // Ask for exactly this version at initialize (the SDK otherwise always asks for its latest).
  transport.send = (message, options) => {
    if (message.method === "initialize") message.params.protocolVersion = version;
    return send(message, options);
  };
  return transport;
}

async function connect(version, name) {
  const client = new Client({ name, version: "1.0.0" }, { capabilities: {} });
  const transport = transportFor(version);
  await client.connect(transport);
  return { client, transport };
}

function checkSchema(where, schema) {
  if (!schema || schema.type !== "object") report.errors.push(`${where}: schema type is ${schema && schema.type}`);
  if (schema && schema.properties && typeof schema.properties !== "object") report.errors.push(`${where}: properties`);
}

function structured(name, result) {
  if (result.isError) throw new Error(`${name}: ${result.content.map((c) => c.text).join(" ")}`);
  return result.structuredContent;
}

// Versions older than 2025-03-26 never had Streamable HTTP; the SDK still lists them for stdio.
const httpVersions = SUPPORTED_PROTOCOL_VERSIONS.filter((v) => v >= "2025-03-26");
for (const version of httpVersions) {
  try {
    const { client, transport } = await connect(version, `ts-sdk-${version}`);
    const { tools } = await client.listTools();
    report.versions[version] = {
      negotiated: transport.protocolVersion ?? null,
      sessionId: transport.sessionId ?? null,
      tools: tools.length,
      server: client.getServerVersion()?.name ?? null,
    };
    await client.close();
  } catch (e) {
    report.errors.push(`initialize ${version}: ${e.message}`);
  }
}

const { client, transport } = await connect(httpVersions[0], "ts-sdk");
try {
  const { tools } = await client.listTools();
  for (const tool of tools) {
    checkSchema(`${tool.name} input`, tool.inputSchema);
    if (tool.outputSchema) checkSchema(`${tool.name} output`, tool.outputSchema);
    report.tools[tool.name] = { output: Boolean(tool.outputSchema) };
  }
  // callTool validates structuredContent against each tool's outputSchema (the SDK throws if it does not match).
  report.calls.profile_list = structured("profile_list", await client.callTool({ name: "profile_list", arguments: {} }));
  const sub = structured("task_submit", await client.callTool({
    name: "task_submit", arguments: { prompt: "say hello from typescript", profile: "scripted" },
  }));
  let page;
  let cursor = 0;
  for (let i = 0; i < 20; i++) {
    page = structured("task_wait", await client.callTool({
      name: "task_wait", arguments: { task_id: sub.task_id, cursor, timeout_s: 10 },
    }));
    cursor = page.cursor;
    if (page.done) break;
  }
  report.calls.task = structured("task_get", await client.callTool({ name: "task_get", arguments: { task_id: sub.task_id } }));
  const lease = structured("rift_task_new", await client.callTool({ name: "rift_task_new", arguments: { name: "ts" } }));
  report.calls.lease = lease;
  const vm = structured("rift_vm_new", await client.callTool({ name: "rift_vm_new", arguments: { task: lease.handle } }));
  report.calls.exec = structured("rift_vm_exec", await client.callTool({
    name: "rift_vm_exec", arguments: { task: lease.handle, vm_id: vm.vm_id, command: "echo hi-from-box" },
  }));
  structured("rift_task_close", await client.callTool({ name: "rift_task_close", arguments: { task: lease.handle } }));
  report.sessionId = transport.sessionId ?? null;
} catch (e) {
  report.errors.push(e.message);
} finally {
  await transport.terminateSession().catch((e) => report.errors.push(`terminateSession: ${e.message}`));
  await client.close();
}
console.log(JSON.stringify(report));
