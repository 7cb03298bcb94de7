// Drives Rein's AG-UI endpoint with the official client (@ag-ui/client's
// HttpAgent) and prints one JSON line with what it saw.
//   node client.cjs <endpoint url> <scenario: conversation | abort>
const { HttpAgent } = require("@ag-ui/client");

async function run(agent, runId, stopAfter) {
  const events = [];
  let result;
  let error;
  try {
    const outcome = await agent.runAgent(
      { runId },
      {
        onEvent: ({ event }) => {
          events.push(event.type);
          if (stopAfter && event.type === stopAfter) agent.abortRun();
        },
      },
    );
    result = outcome.result;
  } catch (e) {
    error = String(e && e.message ? e.message : e);
  }
  return { events, result, error };
}

async function main() {
  const [url, scenario] = process.argv.slice(2);
  const agent = new HttpAgent({ url, threadId: `agui-${scenario}` });
  if (scenario === "conversation") {
    agent.messages = [{ id: "u1", role: "user", content: "hello" }];
    const first = await run(agent, "agui-run-1");
    // The whole conversation is sent again, plus one new message.
    agent.messages.push({ id: "u2", role: "user", content: [{ type: "text", text: "and again" }] });
    const second = await run(agent, "agui-run-2");
    const messages = agent.messages.map((m) => ({ id: m.id, role: m.role }));
    console.log(JSON.stringify({ first, second, messages }));
  } else if (scenario === "abort") {
    agent.messages = [{ id: "u1", role: "user", content: "talk slowly" }];
    const aborted = await run(agent, "agui-abort", "TEXT_MESSAGE_CONTENT");
    console.log(JSON.stringify({ aborted }));
  } else if (scenario === "error") {
    const bad = new HttpAgent({ url: url.replace(/[^/]+$/, "ghost"), threadId: "agui-error" });
    bad.messages = [{ id: "u1", role: "user", content: "hi" }];
    const failed = await run(bad, "agui-error-1");
    console.log(JSON.stringify({ failed }));
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
