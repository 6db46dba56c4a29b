// A hosted agent working like a notebook: open a session, send a CSV in,
// analyse it with pandas across calls, plot it, and take the results out.
//
//   npm install @modelcontextprotocol/sdk
//   AIRLOCK_URL=https://airlock.internal:8765/mcp AIRLOCK_TOKEN=alk_… npx tsx session.ts
import { writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.env.AIRLOCK_URL ?? "http://127.0.0.1:8765/mcp");
const token = process.env.AIRLOCK_TOKEN;
if (!token) throw new Error("set AIRLOCK_TOKEN (`airlock token add NAME` prints one)");

const client = new Client({ name: "example-notebook", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
}));
const call = async (name: string, args: Record<string, unknown>) => {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) throw new Error(`${name}: ${JSON.stringify(r.content)}`);
  return r;
};

const { structuredContent: s } = await call("session_create", {});
const session_id = (s as { session_id: string }).session_id;
try {
  await call("write_file", { session_id, path: "data/sales.csv", content: "month,units\njan,12\nfeb,19\nmar,7\n" });
  // State persists: df defined here is used in the next call.
  await call("run_python", { session_id, code: "import pandas as pd\ndf = pd.read_csv('data/sales.csv')" });
  const table = await call("run_python", { session_id, code: "df.describe()" });
  console.log((table.structuredContent as { display: string }).display);
  // A figure comes back as image content; files under out/ as resources.
  const plot = await call("run_python", {
    session_id,
    code: "import os, matplotlib.pyplot as plt\ndf.plot.bar(x='month', y='units')\nos.makedirs('out', exist_ok=True)\ndf.to_json('out/sales.json')",
  });
  for (const c of plot.content as Array<{ type: string; data?: string }>) {
    if (c.type === "image" && c.data) writeFileSync("sales.png", Buffer.from(c.data, "base64"));
  }
  const json = await call("read_file", { session_id, path: "out/sales.json" });
  console.log((json.structuredContent as { content: string }).content);
} finally {
  await call("session_close", { session_id });
  await client.close();
}
