// A minimal MCP server on the official TypeScript SDK with one tool,
// `wait`, that waits until its request is cancelled and then appends
// "cancelled <request id>" to the file named by CANCEL_LOG: it shows that
// the server received `notifications/cancelled`.
const fs = require("node:fs");
const { McpServer } = require("@modelcontextprotocol/sdk/server/mcp.js");
const { StdioServerTransport } = require("@modelcontextprotocol/sdk/server/stdio.js");

const server = new McpServer({ name: "cancel-log", version: "1.0.0" });
server.registerTool("wait", { description: "Waits until the call is cancelled" }, async (extra) => {
  await new Promise((resolve) => extra.signal.addEventListener("abort", resolve));
  fs.appendFileSync(process.env.CANCEL_LOG, `cancelled ${extra.requestId}\n`);
  return { content: [{ type: "text", text: "cancelled" }] };
});
server.connect(new StdioServerTransport());
