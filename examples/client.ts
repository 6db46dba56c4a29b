// A hosted agent's side: call airlock over streamable HTTP with a bearer
// token, using the official MCP TypeScript SDK, and stream the run's output.
//
//   npm install @modelcontextprotocol/sdk
//   AIRLOCK_URL=https://airlock.internal:8765/mcp AIRLOCK_TOKEN=alk_… npx tsx client.ts
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.env.AIRLOCK_URL ?? "http://127.0.0.1:8765/mcp");
const token = process.env.AIRLOCK_TOKEN;
if (!token) throw new Error("set AIRLOCK_TOKEN (`airlock token add NAME` prints one)");

const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "example-agent", version: "1.0.0" });
await client.connect(transport);

const code = `
import time
for i in range(3):
    print("step", i, flush=True)
    time.sleep(1)
print("done")
`;
const result = await client.callTool(
  { name: "run_python", arguments: { code, timeout_s: 30 } },
  undefined,
  {
    // Output arrives while the code runs; the result still carries all of it.
    onprogress: (p) => process.stderr.write(`progress: ${p.message ?? ""}`),
    timeout: 120_000,
  },
);
console.log(JSON.stringify(result.structuredContent, null, 2));
await client.close();
