// Drives Rein's web console in headless Chromium (playwright-core with the
// system's chromium): node browser.cjs <base url> <token> <scenario> <out dir>.
// Prints one JSON line {ok, scenario, screenshot, ...facts} and exits 0, or
// prints the failure and exits 1. Each scenario saves a screenshot.
'use strict';
const { chromium } = require('playwright-core');
const path = require('path');

const [url, token, scenario, out] = process.argv.slice(2);
const TIMEOUT = 20000;

async function signIn(page) {
  await page.goto(url + '/');
  // Without the token the API refuses, and the page says what to do.
  await page.waitForSelector('#notice:not([hidden])', { timeout: TIMEOUT });
  const refused = await page.textContent('#notice');
  await page.fill('#token', token);
  await page.click('#token-form button');
  await page.waitForSelector('#new-run', { timeout: TIMEOUT });
  return refused;
}

async function submit(page, agent, message) {
  await page.selectOption('#new-agent', agent);
  await page.fill('#new-message', message);
  await page.click('#send');
  await page.waitForURL(/#\/runs\//, { timeout: TIMEOUT });
  await page.waitForSelector('#timeline', { timeout: TIMEOUT });
  return decodeURIComponent(page.url().split('#/runs/')[1]);
}

async function finished(page) {
  await page.waitForSelector('#run-status [data-status="finished"]', { timeout: TIMEOUT });
  return page.getAttribute('#run-termination [data-termination]', 'data-termination');
}

const scenarios = {
  // Open the console, send a message, watch the run stream to its end.
  async stream(page) {
    const refused = await signIn(page);
    const runId = await submit(page, 'writer', 'Plan the launch.');
    // The streamed text arrives piece by piece in round 2 before the end.
    await page.waitForSelector('[data-kind="round"][data-step="2"] .text:not(:empty)', { timeout: TIMEOUT });
    const partial = await page.textContent('[data-kind="round"][data-step="2"] .text');
    const termination = await finished(page);
    const text = await page.textContent('[data-kind="round"][data-step="2"] .text');
    await page.waitForSelector('#chart rect[data-round="2"]', { timeout: TIMEOUT });
    await page.waitForSelector('#report [data-report]', { timeout: TIMEOUT });
    const facts = {
      refused,
      runId,
      partial,
      text,
      termination,
      tool: await page.textContent('[data-kind="tool"] .kind'),
      bars: await page.locator('#chart rect[data-round]').count(),
      budget: await page.getAttribute('#chart line[data-budget]', 'data-budget'),
      limits: await page.textContent('#report table'),
      listed: null,
    };
    await page.screenshot({ path: path.join(out, 'run-page.png'), fullPage: true });
    // The run is in the live list, finished with its termination.
    await page.goto(url + '/#/');
    await page.waitForSelector(`tr[data-run="${runId}"] [data-status="finished"]`, { timeout: TIMEOUT });
    facts.listed = await page.textContent(`tr[data-run="${runId}"]`);
    return { ...facts, screenshot: 'run-page.png' };
  },

  // Cancel a running run from its page.
  async cancel(page) {
    await signIn(page);
    const runId = await submit(page, 'slow', 'Take your time.');
    await page.waitForSelector('[data-kind="round"] .text:not(:empty)', { timeout: TIMEOUT });
    await page.click('#cancel-run');
    const termination = await finished(page);
    await page.screenshot({ path: path.join(out, 'cancelled-run.png'), fullPage: true });
    return { runId, termination, screenshot: 'cancelled-run.png' };
  },

  // Cancel one tool call (a slow sub-agent's); the run goes on and ends.
  async cancel_call(page) {
    await signIn(page);
    const runId = await submit(page, 'patient', 'Ask the dawdler.');
    const button = '[data-kind="tool"] [data-cancel-call]';
    await page.waitForSelector(button, { timeout: TIMEOUT });
    await page.click(button);
    const termination = await finished(page);
    const result = await page.textContent('[data-kind="tool"]');
    await page.screenshot({ path: path.join(out, 'cancelled-call.png'), fullPage: true });
    return { runId, termination, result, screenshot: 'cancelled-call.png' };
  },

  // Approve a pending call on the approvals page; the run finishes.
  async approve(page) {
    await signIn(page);
    const runId = await submit(page, 'ops', 'Wrap it up.');
    await page.waitForSelector('#pending [data-approval]', { timeout: TIMEOUT });
    await page.goto(url + '/#/approvals');
    const card = `#approvals [data-approval]`;
    await page.waitForSelector(card, { timeout: TIMEOUT });
    const waiting = await page.textContent(card);
    await page.screenshot({ path: path.join(out, 'approvals-page.png'), fullPage: true });
    await page.click(`${card} [data-decide="approve"]`);
    await page.waitForSelector(`${card} .badge`, { timeout: TIMEOUT });
    await page.goto(`${url}/#/runs/${encodeURIComponent(runId)}`);
    const termination = await finished(page);
    const decided = await page.textContent('[data-kind="approval"]');
    return { runId, waiting, termination, decided, screenshot: 'approvals-page.png' };
  },

  // Open a run's sub-agent tree and follow it to the child's page.
  async tree(page) {
    await signIn(page);
    const runId = await submit(page, 'lead', 'Ask the researcher.');
    await finished(page);
    const node = '#tree [data-tree-run]';
    await page.waitForSelector(node, { timeout: TIMEOUT });
    const child = await page.getAttribute(node, 'data-tree-run');
    const entry = await page.textContent(node);
    await page.screenshot({ path: path.join(out, 'subagent-tree.png'), fullPage: true });
    await page.click(`${node} > a`);
    await page.waitForURL(new RegExp(`#/runs/${child.replace(/\./g, '\\.')}$`), { timeout: TIMEOUT });
    await page.waitForSelector('#run-status [data-status="finished"]', { timeout: TIMEOUT });
    const parent = await page.textContent('#view > p.muted');
    return { runId, child, entry, parent, screenshot: 'subagent-tree.png' };
  },

  // Replay an uploaded recording against an agent's stop conditions.
  async replay(page) {
    await signIn(page);
    await page.goto(url + '/#/replay');
    await page.waitForSelector('#replay-agent', { timeout: TIMEOUT });
    await page.selectOption('#replay-agent', 'guarded');
    await page.setInputFiles('#replay-file', process.env.REIN_RECORDING);
    await page.click('#replay-run');
    await page.waitForSelector('#replay-result [data-firing]', { timeout: TIMEOUT });
    const firings = await page.$$eval('#replay-result [data-firing]', (nodes) => nodes.map((n) => n.getAttribute('data-firing')));
    await page.screenshot({ path: path.join(out, 'replay-page.png'), fullPage: true });
    return { firings, screenshot: 'replay-page.png' };
  },
};

(async () => {
  const browser = await chromium.launch({ executablePath: process.env.REIN_CHROMIUM, headless: true });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on('pageerror', (error) => errors.push(String(error)));
  page.on('console', (message) => {
    if (message.type() === 'error') errors.push(message.text());
  });
  let bytes = 0;
  page.on('response', async (response) => {
    if (response.request().resourceType() !== 'fetch') {
      bytes += (await response.body().catch(() => Buffer.alloc(0))).length;
    }
  });
  try {
    const facts = await scenarios[scenario](page);
    // A refused API call logs a console error by design (401 before the
    // token); anything else is a fault of the page.
    const faults = errors.filter((e) => !e.includes('401'));
    console.log(JSON.stringify({ ok: faults.length === 0, scenario, faults, asset_bytes: bytes, ...facts }));
  } catch (error) {
    await page.screenshot({ path: path.join(out, `${scenario}-failure.png`), fullPage: true }).catch(() => {});
    console.log(JSON.stringify({ ok: false, scenario, error: String(error), faults: errors, html: (await page.content()).slice(0, 4000) }));
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
})();
