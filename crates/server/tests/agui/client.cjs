// Drives Rein's AG-UI endpoint with the official client (@ag-ui/client's
// HttpAgent) and prints one JSON line with what it saw.
//   node client.cjs <endpoint url> <scenario: conversation | abort | error |
//     subagent | subagent-error | subagent-abort | subagent-cancel | subagent-tree |
//     approval | approval-reject | approval-subagent | question | escalation | limited |
//     judged | planned | auto>
// The sub-agent scenarios record whole events (else only their types), and
// the client's own warnings (an event it had to strip or drop).
const { HttpAgent } = require("@ag-ui/client");

const warnings = [];

// `stop(event)` true: the client aborts the run there. `onEvent(event)`:
// anything else to do on an event.
async function run(agent, runId, stopAfter, { full = false, stop, onEvent, forwardedProps } = {}) {
  const events = [];
  let result;
  let error;
  try {
    const outcome = await agent.runAgent(
      forwardedProps ? { runId, forwardedProps } : { runId },
      {
        onEvent: ({ event }) => {
          events.push(full ? event : event.type);
          if (stopAfter && event.type === stopAfter) agent.abortRun();
          if (stop && stop(event)) agent.abortRun();
          if (onEvent) onEvent(event);
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
  } else if (scenario.startsWith("subagent")) {
    // Warnings count here: an event the client had to strip or drop.
    delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;
    const warn = console.warn;
    console.warn = (...args) => {
      warnings.push(args.map(String).join(" "));
      warn(...args);
    };
    const runId = `agui-${scenario}-run`;
    const child = (event) => event.type === "TEXT_MESSAGE_CONTENT" && event.subagentRunId !== undefined;
    agent.messages = [{ id: "u1", role: "user", content: "look into it" }];
    let options = { full: true };
    if (scenario === "subagent-abort") options.stop = child;
    if (scenario === "subagent-cancel") {
      // Cancelled on the server (not by the client) while the child streams:
      // the client reads the stream to its end.
      let cancelled = false;
      options.onEvent = (event) => {
        if (!cancelled && child(event)) {
          cancelled = true;
          fetch(`${new URL(url).origin}/v1/runs/${runId}/cancel`, { method: "POST" });
        }
      };
    }
    const first = await run(agent, runId, undefined, options);
    let second;
    if (scenario === "subagent") {
      // The whole conversation again (the child's messages included), and one more.
      agent.messages.push({ id: "u2", role: "user", content: "thanks" });
      second = await run(agent, `${runId}-2`);
    }
    const messages = agent.messages.map((m) => ({ id: m.id, role: m.role, subagentRunId: m.subagentRunId }));
    console.log(JSON.stringify({ first, second, messages, warnings }));
  } else if (scenario.startsWith("approval") || scenario === "question" || scenario === "escalation") {
    // A run that parks ends on an interrupt; a second run resumes it.
    delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;
    const warn = console.warn;
    console.warn = (...args) => {
      warnings.push(args.map(String).join(" "));
      warn(...args);
    };
    agent.messages = [{ id: "u1", role: "user", content: "go ahead" }];
    const first = await run(agent, `agui-${scenario}-1`, undefined, { full: true });
    const pending = (agent.pendingInterrupts || []).map((i) => ({ ...i }));
    const finished = first.events.find((e) => e.type === "RUN_FINISHED");
    const interrupts = (finished && finished.outcome && finished.outcome.interrupts) || [];
    const payload =
      scenario === "question"
        ? { decision: "respond", result: "eu" }
        : scenario === "escalation"
          ? { decision: "continue", message: "Yes, run it." }
        : scenario === "approval-reject"
          ? undefined
          : { decision: "approve" };
    const resume = interrupts.map((i) =>
      payload === undefined
        ? { interruptId: i.id, status: "cancelled" }
        : { interruptId: i.id, status: "resolved", payload },
    );
    const second = await new Promise((resolve) => setTimeout(resolve, 10)).then(async () => {
      const events = [];
      let error;
      try {
        await agent.runAgent(
          { runId: `agui-${scenario}-2`, resume },
          { onEvent: ({ event }) => events.push(event) },
        );
      } catch (e) {
        error = String(e && e.message ? e.message : e);
      }
      return { events, error };
    });
    const after = (agent.pendingInterrupts || []).length;
    const messages = agent.messages.map((m) => ({ id: m.id, role: m.role, toolCalls: (m.toolCalls || []).map((c) => c.id), content: m.content }));
    console.log(JSON.stringify({ first, pending, second, after, messages, warnings }));
  } else if (scenario === "limited") {
    // Two runs back to back on a provider allowing one request a second:
    // the second waits, and says so in a CUSTOM event.
    delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;
    const warn = console.warn;
    console.warn = (...args) => {
      warnings.push(args.map(String).join(" "));
      warn(...args);
    };
    agent.messages = [{ id: "u1", role: "user", content: "first" }];
    const first = await run(agent, "agui-limited-1", undefined, { full: true });
    agent.messages.push({ id: "u2", role: "user", content: "second" });
    const second = await run(agent, "agui-limited-2", undefined, { full: true });
    console.log(JSON.stringify({ first, second, warnings }));
  } else if (scenario === "planned") {
    // One run keeping a plan: its changes reach the client as
    // STATE_SNAPSHOT, then STATE_DELTA; the client's state is the plan.
    delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;
    const warn = console.warn;
    console.warn = (...args) => {
      warnings.push(args.map(String).join(" "));
      warn(...args);
    };
    agent.messages = [{ id: "u1", role: "user", content: "plan my trip" }];
    const first = await run(agent, "agui-planned-1", undefined, { full: true });
    console.log(JSON.stringify({ first, state: agent.state, warnings }));
  } else if (scenario === "judged") {
    // One run a judging model stops: its check reaches the client as a
    // CUSTOM event, with whatever the client warns about.
    delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;
    const warn = console.warn;
    console.warn = (...args) => {
      warnings.push(args.map(String).join(" "));
      warn(...args);
    };
    agent.messages = [{ id: "u1", role: "user", content: "wait for job 7" }];
    const first = await run(agent, "agui-judged-1", undefined, { full: true });
    console.log(JSON.stringify({ first, warnings }));
  } else if (scenario === "auto") {
    // An auto-mode session asked for in forwardedProps' metadata: all its
    // rounds in one AG-UI run, progress as CUSTOM events.
    delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;
    const warn = console.warn;
    console.warn = (...args) => {
      warnings.push(args.map(String).join(" "));
      warn(...args);
    };
    agent.messages = [{ id: "u1", role: "user", content: "Tune the model." }];
    const forwardedProps = {
      metadata: { run_mode: "auto", automation_policy: { maxExperiments: 2, maxTokens: 50000 } },
    };
    const first = await run(agent, "agui-auto-1", undefined, { full: true, forwardedProps });
    console.log(JSON.stringify({ first, warnings }));
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
