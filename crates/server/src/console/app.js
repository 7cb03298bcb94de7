// Rein's web console: runs, approvals and replay over the HTTP API
// (docs/console.md). Plain JavaScript, no build step, no dependencies; every
// request carries the token entered in the header (sessionStorage).
'use strict';
(() => {
  const state = { token: sessionStorage.getItem('rein.token') || '', timers: [], aborts: [] };

  // ---- DOM helpers ------------------------------------------------------

  const $ = (selector, root = document) => root.querySelector(selector);

  /** An element with attributes (`text`, `class`, `on…` handlers) and children. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'text') node.textContent = value;
      else if (key === 'class') node.className = value;
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? '' : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const enc = encodeURIComponent;
  const json = (value) => JSON.stringify(value, null, 2);
  const time = (rfc) => (rfc ? new Date(rfc).toLocaleTimeString() : '');
  const tokens = (usage) => (usage ? usage.input_tokens + usage.output_tokens : 0);
  const runLink = (id) => el('a', { href: `#/runs/${enc(id)}`, class: 'mono', text: id });

  function badge(status) {
    return el('span', { class: `badge ${status}`, 'data-status': status, text: status.replace('_', ' ') });
  }

  function terminationBadge(code) {
    if (!code) return '';
    const bad = ['error', 'cancelled', 'consecutive_errors', 'error_rate'].includes(code);
    const kind = code === 'natural_end' ? 'finished' : bad ? 'bad' : 'warn';
    return el('span', { class: `badge ${kind}`, 'data-termination': code, text: code });
  }

  function notice(text, kind) {
    const node = $('#notice');
    node.textContent = text || '';
    node.className = kind || '';
    node.hidden = !text;
  }

  // ---- The API ----------------------------------------------------------

  function headers(withBody) {
    const h = {};
    if (state.token) h.Authorization = `Bearer ${state.token}`;
    if (withBody) h['Content-Type'] = 'application/json';
    return h;
  }

  /** A JSON request; a refusal throws with the API's code and message. */
  async function api(method, path, body) {
    const response = await fetch(path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const type = response.headers.get('content-type') || '';
    const data = type.startsWith('application/json') ? await response.json() : null;
    if (response.status === 401) {
      notice('This server needs a token: enter one of server.auth above.');
    }
    if (!response.ok) {
      const error = new Error(data && data.error ? `${data.error.code}: ${data.error.message}` : `HTTP ${response.status}`);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  /** Reads an SSE stream with fetch (which, unlike EventSource, sends the token). */
  async function stream(path, onEvent) {
    const abort = new AbortController();
    state.aborts.push(abort);
    const response = await fetch(path, { headers: headers(false), signal: abort.signal });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let type = 'message';
        let data = '';
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? '' : line.slice(colon + 1);
          if (text.startsWith(' ')) text = text.slice(1);
          if (field === 'event') type = text;
          else if (field === 'data') data += (data ? '\n' : '') + text;
        }
        if (data) onEvent(type, JSON.parse(data));
      }
    }
  }

  /** Calls `refresh` now and every `ms` until the view changes. */
  function every(ms, refresh) {
    const tick = async () => {
      try {
        await refresh();
      } catch (error) {
        notice(error.message);
      }
    };
    tick();
    state.timers.push(setInterval(tick, ms));
  }

  async function act(button, action) {
    button.disabled = true;
    try {
      await action();
      notice('');
    } catch (error) {
      notice(error.message);
    } finally {
      button.disabled = false;
    }
  }

  let agentsCache = null;
  async function agents() {
    agentsCache = agentsCache || (await api('GET', '/v1/agents'));
    return agentsCache;
  }

  // ---- Runs: the live lists and a new run ---------------------------------

  async function runsView(root) {
    const runsBody = el('tbody', { id: 'runs' });
    const threadsBody = el('tbody', { id: 'threads' });
    const form = await newRunForm();
    root.append(
      el('h1', { text: 'Runs' }),
      el('div', { class: 'grid' },
        el('section', {},
          el('div', { class: 'card' },
            el('table', {},
              el('thead', {}, el('tr', {}, ['run', 'thread', 'agent', 'status', 'termination', 'rounds', 'tokens', 'submitted'].map((h) => el('th', { text: h })))),
              runsBody))),
        el('section', {},
          el('div', { class: 'card' }, el('h2', { text: 'New run' }), form),
          el('div', { class: 'card' },
            el('h2', { text: 'Threads' }),
            el('table', {},
              el('thead', {}, el('tr', {}, ['thread', 'runs', 'latest', 'status'].map((h) => el('th', { text: h })))),
              threadsBody)))));
    every(2000, async () => {
      const [runs, threads] = await Promise.all([
        api('GET', '/v1/runs?top_level=true&limit=50'),
        api('GET', '/v1/threads?limit=30'),
      ]);
      runsBody.replaceChildren(...runs.runs.map((r) => el('tr', { 'data-run': r.run_id },
        el('td', {}, runLink(r.run_id)),
        el('td', { class: 'mono', text: r.thread_id }),
        el('td', { text: r.agent_id }),
        el('td', {}, badge(r.status)),
        el('td', {}, terminationBadge(r.termination)),
        el('td', { class: 'num', text: r.steps ?? '' }),
        el('td', { class: 'num', text: r.usage ? tokens(r.usage) : '' }),
        el('td', { text: time(r.created_at) }))));
      if (!runs.runs.length) runsBody.append(el('tr', {}, el('td', { colspan: 8, class: 'muted', text: 'No runs yet: start one on the right.' })));
      threadsBody.replaceChildren(...threads.threads.map((t) => el('tr', {},
        el('td', { class: 'mono', text: t.thread_id }),
        el('td', { class: 'num', text: t.runs }),
        el('td', {}, t.last_run ? runLink(t.last_run.run_id) : ''),
        el('td', {}, t.last_run ? badge(t.last_run.status) : '', ' ', t.last_run ? terminationBadge(t.last_run.termination) : ''))));
    });
  }

  async function newRunForm(thread, agentId) {
    const list = await agents();
    const agent = el('select', { id: 'new-agent' }, list.map((a) => el('option', { value: a.id, text: a.id, selected: a.id === agentId })));
    const threadInput = el('input', { id: 'new-thread', value: thread || `console-${Date.now().toString(36)}` });
    const strategy = el('select', { id: 'new-strategy' }, ['interrupt', 'enqueue', 'reject'].map((s) => el('option', { value: s, text: s })));
    const message = el('textarea', { id: 'new-message', placeholder: 'Message', required: true });
    const send = el('button', { type: 'submit', class: 'primary', id: 'send', text: 'Send' });
    const form = el('form', { class: 'inline', id: 'new-run' },
      thread ? '' : el('label', {}, 'Thread', threadInput),
      el('label', {}, 'Agent', agent),
      el('label', {}, 'If busy', strategy),
      message, send);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      act(send, async () => {
        const target = thread || threadInput.value.trim();
        const accepted = await api('POST', `/v1/threads/${enc(target)}/runs`, {
          agent_id: agent.value,
          strategy: strategy.value,
          messages: [{ role: 'user', content: message.value }],
        });
        location.hash = `#/runs/${enc(accepted.run_id)}`;
      });
    });
    return form;
  }

  // ---- One run: timeline, chart, report, tree, controls -------------------

  async function runView(root, runId) {
    let record = await api('GET', `/v1/runs/${enc(runId)}`);
    const status = el('span', { id: 'run-status' }, badge(record.status));
    const termination = el('span', { id: 'run-termination' });
    const timeline = el('ul', { class: 'timeline', id: 'timeline' });
    const chart = el('div', { id: 'chart' });
    const report = el('div', { id: 'report' });
    const tree = el('div', { id: 'tree' });
    const pending = el('div', { id: 'pending' });
    const cancelRun = el('button', { class: 'danger', id: 'cancel-run', text: 'Cancel run' });
    const cancelThread = el('button', { class: 'danger', id: 'cancel-thread', text: 'Cancel thread' });
    cancelRun.addEventListener('click', () => act(cancelRun, () => api('POST', `/v1/runs/${enc(runId)}/cancel`, {})));
    cancelThread.addEventListener('click', () => act(cancelThread, () => api('POST', `/v1/threads/${enc(record.thread_id)}/cancel`, {})));
    const agent = (await agents()).find((a) => a.id === record.agent_id);
    const budget = agent && agent.token_budget;
    root.append(
      el('h1', {}, 'Run ', el('span', { class: 'mono', text: runId }), ' ', status, ' ', termination),
      el('p', { class: 'muted' },
        `agent ${record.agent_id} · thread `, el('span', { class: 'mono', text: record.thread_id }),
        record.parent_run_id ? [' · sub-agent of ', runLink(record.parent_run_id)] : ''),
      el('div', { class: 'row' }, cancelRun, cancelThread),
      el('div', { class: 'grid' },
        el('section', {}, el('h2', { text: 'Timeline' }), timeline),
        el('section', {},
          el('div', { class: 'card' }, el('h2', { text: 'Pending approvals' }), pending),
          el('div', { class: 'card' }, el('h2', { text: budget ? `Tokens per round (budget ${budget})` : 'Tokens per round' }), chart),
          el('div', { class: 'card' }, el('h2', { text: 'Stop report' }), report),
          el('div', { class: 'card' }, el('h2', { text: 'Sub-agents' }), tree),
          el('div', { class: 'card' }, el('h2', { text: 'Send to this thread' }), await newRunForm(record.thread_id, record.agent_id)))));

    const rounds = [];
    const calls = new Map();
    const approvals = new Map();
    let current = null;
    const add = (kind, ...children) => {
      const item = el('li', { class: kind, 'data-kind': kind }, ...children);
      timeline.append(item);
      return item;
    };
    const showPending = () => {
      pending.replaceChildren(...[...approvals.values()].filter((a) => !a.decided).map((a) => approvalCard(a.pending)));
      if (!pending.children.length) pending.append(el('p', { class: 'muted', text: 'None.' }));
    };
    const finish = async () => {
      record = await api('GET', `/v1/runs/${enc(runId)}`);
      status.replaceChildren(badge(record.status));
      termination.replaceChildren(terminationBadge(record.termination && codeOf(record.termination)));
      report.replaceChildren(stopReport(record.report));
      tree.replaceChildren(await subagentTree(record));
      cancelRun.disabled = record.status === 'finished';
    };
    showPending();
    chart.append(el('p', { class: 'muted', text: 'Each round once its provider reports its tokens.' }));
    report.append(el('p', { class: 'muted', text: 'When the run ends.' }));
    tree.append(await subagentTree(record));

    const apply = (type, e) => {
      if (e.run_id !== runId) return;
      switch (type) {
        case 'run_started':
          add('start', el('span', { class: 'kind', text: 'Started' }), `agent ${e.agent_id}`);
          break;
        case 'step_started':
        case 'retry_started': {
          const head = el('div', {}, el('span', { class: 'kind', text: `Round ${e.step}` }), type === 'retry_started' ? `attempt ${e.attempt}` : '');
          const text = el('div', { class: 'text' });
          current = { step: e.step, head, text };
          add('round', head, text).setAttribute('data-step', e.step);
          break;
        }
        case 'text_delta':
          if (current) current.text.append(e.delta);
          break;
        case 'round_usage':
          rounds.push({ step: e.step, usage: e.usage });
          if (current && current.step === e.step) current.head.append(el('span', { class: 'muted', text: ` · ${e.usage.input_tokens} in / ${e.usage.output_tokens} out${e.model ? ` · ${e.model}` : ''}` }));
          chart.replaceChildren(tokenChart(rounds, budget));
          break;
        case 'tool_call_started': {
          const cancel = el('button', { class: 'danger', 'data-cancel-call': e.call_id, text: 'Cancel call' });
          cancel.addEventListener('click', () => act(cancel, () => api('POST', `/v1/runs/${enc(runId)}/tool_calls/${enc(e.call_id)}/cancel`, {})));
          const outcome = el('div', {}, el('span', { class: 'badge running', text: 'running' }), ' ', cancel);
          const item = add('tool', el('span', { class: 'kind', text: e.name }), el('span', { class: 'muted mono', text: e.call_id }), el('pre', { text: json(e.arguments) }), outcome);
          item.setAttribute('data-call', e.call_id);
          calls.set(e.call_id, outcome);
          break;
        }
        case 'tool_call_finished': {
          const outcome = calls.get(e.call_id);
          const result = el('div', {}, e.is_error ? el('span', { class: 'badge bad', text: 'error' }) : el('span', { class: 'badge finished', text: 'done' }), el('pre', { text: e.result }));
          if (outcome) outcome.replaceWith(result);
          break;
        }
        case 'inference_retry':
          add('retry', el('span', { class: 'kind', text: 'Retry' }), `attempt ${e.attempt} in ${e.delay_ms} ms: ${e.error}`);
          break;
        case 'rate_limited':
          add('retry', el('span', { class: 'kind', text: 'Rate limited' }), `waiting about ${e.wait_ms} ms for provider ${e.provider}`);
          break;
        case 'model_fallback':
          add('retry', el('span', { class: 'kind', text: 'Fallback' }), `${e.from_model} → ${e.to_model}: ${e.error}`);
          break;
        case 'nudge':
          add('nudge', el('span', { class: 'kind', text: 'Nudge' }), e.text);
          break;
        case 'detected':
          add('detected', el('span', { class: 'kind', text: `Detected ${e.code}` }), el('span', { class: 'badge warn', text: e.action }), ' ', e.detail);
          break;
        case 'context_compacted':
          add('context', el('span', { class: 'kind', text: 'Context compacted' }), `${e.trigger}: ${e.before_tokens} → ${e.after_tokens} tokens, ${e.references} results as references`);
          break;
        case 'context_summarized':
          add('context', el('span', { class: 'kind', text: 'Context summarized' }), `${e.before_tokens} → ${e.after_tokens} tokens, ${e.messages} messages`);
          break;
        case 'progress':
          add('progress', el('span', { class: 'kind', text: 'Progress' }), e.message);
          break;
        case 'subagent_started':
          add('subagent', el('span', { class: 'kind', text: `Sub-agent ${e.agent_id}` }), runLink(e.child_run_id)).setAttribute('data-child', e.child_run_id);
          break;
        case 'subagent_finished':
          add('subagent', el('span', { class: 'kind', text: 'Sub-agent ended' }), runLink(e.child_run_id), ' ', terminationBadge(codeOf(e.termination)));
          break;
        case 'approval_requested': {
          const item = add('approval', el('span', { class: 'kind', text: `Waits for a decision: ${e.tool}` }), el('pre', { text: json(e.arguments) }));
          approvals.set(e.call_id, { item, decided: false, pending: { ...e, run_id: runId } });
          showPending();
          break;
        }
        case 'run_parked':
          status.replaceChildren(badge('awaiting_approval'));
          for (const p of e.pending) {
            const known = approvals.get(p.call_id);
            if (known) known.pending = p;
          }
          showPending();
          break;
        case 'approval_decided': {
          const known = approvals.get(e.call_id);
          if (known) {
            known.decided = true;
            known.item.append(el('div', {}, el('span', { class: 'badge finished', text: e.decision }), e.decided_by ? ` by ${e.decided_by}` : ''));
          }
          status.replaceChildren(badge('running'));
          showPending();
          break;
        }
        case 'run_finished': {
          const code = codeOf(e.termination);
          add(`end${['error', 'cancelled'].includes(code) ? ' bad' : ''}`, el('span', { class: 'kind', text: 'Finished' }), terminationBadge(code), ' ', e.termination.value && e.termination.value.detail ? e.termination.value.detail : '', e.response ? el('div', { class: 'text', text: e.response }) : '');
          finish().catch((error) => notice(error.message));
          break;
        }
        default:
          break;
      }
    };
    if (record.status === 'finished') finish().catch((error) => notice(error.message));
    stream(`/v1/runs/${enc(runId)}/events`, apply).catch((error) => {
      if (error.name !== 'AbortError') notice(error.message);
    });
  }

  const codeOf = (termination) => (termination.type === 'stopped' ? termination.value.code : termination.type);

  /** Buttons that decide one pending call (approve, reject, edit; respond to a question). */
  function approvalCard(p) {
    const path = `/v1/runs/${enc(p.run_id)}/approvals/${enc(p.call_id)}`;
    const card = el('div', { class: 'approval-card', 'data-approval': p.call_id });
    const decide = (button, body) => act(button, async () => {
      await api('POST', path, body);
      card.replaceChildren(el('span', { class: 'badge finished', text: `${body.decision} sent` }));
    });
    const kind = p.kind || 'approval';
    const title = kind === 'question' ? (p.question || 'A question') : `${p.tool}`;
    card.append(el('div', {}, el('strong', { text: title }), ' ', el('span', { class: 'muted', text: `run ${p.run_id} · call ${p.call_id}` }), p.expires_at ? el('span', { class: 'muted', text: ` · expires ${time(p.expires_at)}` }) : ''));
    if (kind === 'question') {
      const answer = el('input', { placeholder: 'Answer', 'data-answer': '' });
      const respond = el('button', { class: 'primary', text: 'Respond' });
      respond.addEventListener('click', () => decide(respond, { decision: 'respond', result: answer.value }));
      card.append(el('div', { class: 'row' }, answer, respond, ...(p.options || []).map((o) => {
        const pick = el('button', { text: o });
        pick.addEventListener('click', () => decide(pick, { decision: 'respond', result: o }));
        return pick;
      })));
      return card;
    }
    if (kind === 'escalation') {
      for (const [label, decision] of [['Continue', 'continue'], ['Stop', 'stop'], ['Take over', 'take_over']]) {
        const button = el('button', { text: label });
        button.addEventListener('click', () => decide(button, { decision }));
        card.append(button, ' ');
      }
      return card;
    }
    const args = el('textarea', { 'data-arguments': '' });
    args.value = json(p.arguments);
    args.rows = Math.min(12, Math.max(3, args.value.split('\n').length));
    const approve = el('button', { class: 'primary', 'data-decide': 'approve', text: 'Approve' });
    const edit = el('button', { 'data-decide': 'edit', text: 'Run with edited arguments' });
    const reason = el('input', { placeholder: 'Reason (optional)' });
    const reject = el('button', { class: 'danger', 'data-decide': 'reject', text: 'Reject' });
    approve.addEventListener('click', () => decide(approve, { decision: 'approve' }));
    edit.addEventListener('click', () => {
      let parsed;
      try {
        parsed = JSON.parse(args.value);
      } catch (error) {
        notice(`The arguments are not JSON: ${error.message}`);
        return;
      }
      decide(edit, { decision: 'edit', arguments: parsed });
    });
    reject.addEventListener('click', () => decide(reject, reason.value ? { decision: 'reject', reason: reason.value } : { decision: 'reject' }));
    card.append(args, el('div', { class: 'row' }, approve, edit, reason, reject));
    return card;
  }

  /** Bars of each round's tokens (input, output) and the cumulative line against the budget. */
  function tokenChart(rounds, budget) {
    const ns = 'http://www.w3.org/2000/svg';
    const svg = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      return node;
    };
    const width = 420;
    const height = 180;
    const pad = { left: 44, right: 8, top: 10, bottom: 22 };
    let sum = 0;
    const cumulative = rounds.map((r) => (sum += tokens(r.usage)));
    const top = Math.max(1, sum, budget || 0) * 1.05;
    const x = (i) => pad.left + ((width - pad.left - pad.right) * i) / Math.max(rounds.length, 1);
    const y = (v) => height - pad.bottom - ((height - pad.top - pad.bottom) * v) / top;
    const band = (width - pad.left - pad.right) / Math.max(rounds.length, 1);
    const chart = svg('svg', { class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': 'tokens per round' });
    chart.append(svg('line', { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), stroke: '#dde2ea' }));
    chart.append(svg('text', { x: 2, y: y(top / 1.05) + 4 }, Math.round(top / 1.05)));
    chart.append(svg('text', { x: 2, y: y(0) }, '0'));
    rounds.forEach((r, i) => {
      const w = Math.max(band * 0.6, 2);
      const left = x(i) + (band - w) / 2;
      chart.append(svg('rect', { x: left, y: y(r.usage.input_tokens), width: w, height: y(0) - y(r.usage.input_tokens), fill: '#7aa2ff', 'data-round': r.step }));
      chart.append(svg('rect', { x: left, y: y(tokens(r.usage)), width: w, height: y(r.usage.input_tokens) - y(tokens(r.usage)), fill: '#2d5bd3' }));
      chart.append(svg('text', { x: left, y: height - 6 }, r.step));
    });
    if (rounds.length) {
      const points = cumulative.map((v, i) => `${x(i) + band / 2},${y(v)}`).join(' ');
      chart.append(svg('polyline', { points, fill: 'none', stroke: '#805ad5', 'stroke-width': 2 }));
    }
    if (budget) {
      chart.append(svg('line', { x1: pad.left, x2: width - pad.right, y1: y(budget), y2: y(budget), stroke: '#c53030', 'stroke-dasharray': '4 3', 'data-budget': budget }));
      chart.append(svg('text', { x: width - pad.right - 60, y: y(budget) - 3 }, `budget ${budget}`));
    }
    return el('div', {}, chart, el('p', { class: 'muted', text: `${sum} tokens in ${rounds.length} round(s): bars are each round's input (light) and output (dark); the line is the running total.` }));
  }

  /** A bar filled `used` of `limit` (sized through the CSSOM: the page's policy refuses inline styles). */
  function meter(used, limit) {
    const fill = el('span', { class: used >= limit ? 'full' : '' });
    fill.style.width = `${Math.min(100, (100 * used) / Math.max(limit, 1))}%`;
    return fill;
  }

  function stopReport(report) {
    if (!report) return el('p', { class: 'muted', text: 'No report.' });
    return el('div', { 'data-report': report.code },
      el('p', {}, terminationBadge(report.code), ' ', report.detail),
      report.limits.length ? el('table', {}, report.limits.map((l) => el('tr', {},
        el('td', { text: l.name }),
        el('td', { class: 'num', text: `${l.used} / ${l.limit} ${l.unit}` }),
        el('td', {}, el('div', { class: 'bar' }, meter(l.used, l.limit)))))) : '',
      report.tool_calls && report.tool_calls.length ? el('p', {}, 'Calls that did not complete: ', report.tool_calls.map((c) => `${c.name} (${c.status})`).join(', ')) : '',
      el('p', {}, report.resumable ? 'Resumable: the thread can go on as it is.' : 'Not resumable without checking: a call may have taken effect unseen.'),
      report.hint ? el('p', { class: 'muted', text: report.hint }) : '');
  }

  /** The run's sub-agent runs, and theirs, as a tree of links. */
  async function subagentTree(record, depth = 0) {
    if (!record.children || !record.children.length) return depth ? '' : el('p', { class: 'muted', text: 'None.' });
    const items = await Promise.all(record.children.map(async (id) => {
      const child = await api('GET', `/v1/runs/${enc(id)}`).catch(() => null);
      if (!child) return el('li', {}, runLink(id));
      return el('li', { 'data-tree-run': id },
        runLink(id), ' ', el('span', { text: child.agent_id }), ' ', badge(child.status), ' ',
        terminationBadge(child.termination && codeOf(child.termination)),
        depth < 8 ? await subagentTree(child, depth + 1) : '');
    }));
    return el('ul', { class: 'tree' }, items);
  }

  // ---- Approvals ----------------------------------------------------------

  async function approvalsView(root) {
    const list = el('div', { id: 'approvals' });
    root.append(el('h1', { text: 'Pending approvals' }), list);
    let shown = '';
    every(1500, async () => {
      const pending = await api('GET', '/v1/approvals');
      const key = pending.map((p) => `${p.run_id}/${p.call_id}`).join(',');
      if (key === shown) return;
      shown = key;
      list.replaceChildren(...pending.map((p) => el('div', { class: 'card' }, el('p', {}, 'Run ', runLink(p.run_id), ` · thread ${p.thread_id}`), approvalCard(p))));
      if (!pending.length) list.append(el('p', { class: 'muted', text: 'Nothing waits for a decision.' }));
    });
  }

  // ---- Replay -------------------------------------------------------------

  async function replayView(root) {
    const agent = el('select', { id: 'replay-agent' }, (await agents()).map((a) => el('option', { value: a.id, text: a.id })));
    const file = el('input', { type: 'file', id: 'replay-file', accept: '.jsonl,.json,.txt' });
    const run = el('button', { class: 'primary', id: 'replay-run', text: 'Replay' });
    const out = el('div', { id: 'replay-result' });
    root.append(
      el('h1', { text: 'Replay a recording' }),
      el('p', { class: 'muted', text: "Runs a recording (rein serve --record, or a JsonlSink file) against an agent's stop conditions, detectors and approval rules, offline: where each would have fired." }),
      el('div', { class: 'card' }, el('div', { class: 'inline row' }, el('label', {}, 'Agent', agent), el('label', {}, 'Recording', file), run)),
      out);
    run.addEventListener('click', () => act(run, async () => {
      if (!file.files.length) throw new Error('Choose a recording file first.');
      const recording = await file.files[0].text();
      const report = await api('POST', '/v1/replay', { agent_id: agent.value, recording });
      out.replaceChildren(replayReport(report));
    }));
  }

  function replayReport(report) {
    const codes = Object.entries(report.summary.codes);
    return el('div', {},
      el('div', { class: 'card' },
        el('h2', { text: `${report.summary.runs} run(s)` }),
        el('table', {},
          el('thead', {}, el('tr', {}, ['run', 'rounds', 'ended', 'would have fired'].map((h) => el('th', { text: h })))),
          el('tbody', {}, report.runs.map((r) => el('tr', { 'data-replay-run': r.run_id },
            el('td', { class: 'mono', text: r.run_id }),
            el('td', { class: 'num', text: r.rounds }),
            el('td', {}, terminationBadge(r.ended)),
            el('td', {}, r.firings.length ? el('ul', {}, r.firings.map((f) => el('li', { 'data-firing': f.code }, `round ${f.round}: `, el('strong', { text: f.code }), ` (${f.action}) ${f.detail}`))) : el('span', { class: 'muted', text: 'nothing' }))))))),
      el('div', { class: 'card' },
        el('h2', { text: 'How often' }),
        codes.length ? el('table', {}, codes.map(([code, t]) => el('tr', {}, el('td', { text: code }), el('td', { class: 'num', text: `${t.firings} firing(s) in ${t.runs} run(s)` })))) : el('p', { class: 'muted', text: 'No condition would have fired.' })),
      report.approvals ? el('div', { class: 'card' },
        el('h2', { text: 'Approval rules' }),
        el('table', {}, el('thead', {}, el('tr', {}, ['rule', 'action', 'calls', 'runs'].map((h) => el('th', { text: h })))),
          el('tbody', {}, report.approvals.rules.map((r) => el('tr', {}, el('td', { class: 'mono', text: r.rule }), el('td', { text: r.action }), el('td', { class: 'num', text: r.calls }), el('td', { class: 'num', text: r.runs })))))) : '');
  }

  // ---- Routing ------------------------------------------------------------

  async function pendingCount() {
    const count = $('#pending-count');
    try {
      const pending = await api('GET', '/v1/approvals');
      count.textContent = pending.length;
      count.hidden = !pending.length;
    } catch (_) {
      count.hidden = true;
    }
  }

  async function route() {
    state.timers.forEach(clearInterval);
    state.aborts.forEach((a) => a.abort());
    state.timers = [];
    state.aborts = [];
    notice('');
    const root = $('#view');
    root.replaceChildren();
    const hash = location.hash.slice(1) || '/';
    const run = hash.match(/^\/runs\/(.+)$/);
    const view = run ? 'run' : hash === '/approvals' ? 'approvals' : hash === '/replay' ? 'replay' : 'runs';
    document.querySelectorAll('[data-nav]').forEach((a) => a.classList.toggle('active', a.dataset.nav === view || (view === 'run' && a.dataset.nav === 'runs')));
    try {
      if (run) await runView(root, decodeURIComponent(run[1]));
      else if (view === 'approvals') await approvalsView(root);
      else if (view === 'replay') await replayView(root);
      else await runsView(root);
    } catch (error) {
      notice(error.message);
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    const input = $('#token');
    input.value = state.token;
    $('#token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      state.token = input.value.trim();
      sessionStorage.setItem('rein.token', state.token);
      agentsCache = null;
      route();
    });
    window.addEventListener('hashchange', route);
    setInterval(pendingCount, 3000);
    pendingCount();
    route();
  });
})();
