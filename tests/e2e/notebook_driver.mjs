// Reviews a Kaizen notebook edit proposal in headless Chromium: "Ask Kaizen about this
// notebook" from the notebook toolbar, the proposal card, Accept (with "run after insert"),
// Reject and Undo applied to the open notebook, and the kernel-access checkbox. Started by
// tests/e2e/test_notebook_review.py; prints one JSON line per step, exits non-zero on failure.
//
// env: KAIZEN_E2E_BASE_URL, KAIZEN_E2E_TOKEN, KAIZEN_E2E_SCREENSHOTS, KAIZEN_E2E_CHROMIUM
import path from 'node:path';

import { here, log, runDriver } from './driver_kit.mjs';

const base = process.env.KAIZEN_E2E_BASE_URL;
const token = process.env.KAIZEN_E2E_TOKEN;
const shots = process.env.KAIZEN_E2E_SCREENSHOTS || here;
const TIMEOUT = 90000;

async function cellTexts(page) {
  return page.$$eval('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-InputArea-editor', nodes =>
    nodes.map(n => n.textContent)
  );
}

async function waitCells(page, predicate, what) {
  const deadline = Date.now() + TIMEOUT;
  let texts = [];
  while (Date.now() < deadline) {
    texts = await cellTexts(page);
    if (predicate(texts)) {
      return texts;
    }
    await page.waitForTimeout(100);
  }
  throw new Error(`${what}: cells are ${JSON.stringify(texts)}`);
}

await runDriver(async browser => {
  const context = await browser.newContext({ viewport: { width: 1500, height: 950 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', error => errors.push(String(error)));
  await page.goto(`${base}lab/tree/review.ipynb?token=${token}`, { waitUntil: 'domcontentloaded' });
  await page.locator('.jp-NotebookPanel .jp-Cell').first().waitFor({ timeout: TIMEOUT });
  await waitCells(page, t => t.length === 3, 'notebook open');
  // The kernel is started (and idle) before anything runs in it.
  await page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').waitFor({ timeout: TIMEOUT }).catch(() => undefined);
  log('notebook-open');

  // The notebook toolbar's Kaizen button: a question, sent with the notebook attached.
  await page.locator('.jp-NotebookPanel-toolbar [data-command="kaizen:ask-about-notebook"]').click();
  await page.locator('.jp-Dialog').waitFor({ timeout: TIMEOUT });
  await page.keyboard.type('tidy this notebook');
  await page.keyboard.press('Enter');
  const card = page.locator('.jp-Kaizen-proposal');
  await card.waitFor({ timeout: TIMEOUT });
  await page.locator('.jp-Kaizen-answer[data-committed="true"]', { hasText: 'Proposed' }).waitFor({ timeout: TIMEOUT });
  const chip = await page.locator('.jp-Kaizen-chip').innerText();
  log('proposal-shown', { cells: await card.locator('.jp-Kaizen-proposedCell').count(), chip });
  await page.screenshot({ path: path.join(shots, 'notebook-proposal.png') });
  // Nothing changed in the notebook by proposing.
  await waitCells(page, t => t.length === 3 && t[2].includes('print(x)') && !t[2].includes('x * 2'), 'unchanged');

  const row = ordinal => card.locator(`.jp-Kaizen-proposedCell[data-ordinal="${ordinal}"]`);
  // Accept the replacement: the open notebook's cell changes.
  await row(0).locator('.jp-Kaizen-acceptCell').click();
  await row(0).locator('[data-state="applied"], .jp-Kaizen-undoCell').first().waitFor({ timeout: TIMEOUT });
  await page.locator('.jp-Kaizen-proposedCell[data-ordinal="0"][data-state="applied"]').waitFor({ timeout: TIMEOUT });
  await waitCells(page, t => t.some(x => x.includes('print(x * 2)')), 'replaced');
  log('accepted-replace');

  // Reject the delete: the cell stays.
  await row(2).locator('.jp-Kaizen-rejectCell').click();
  await page.locator('.jp-Kaizen-proposedCell[data-ordinal="2"][data-state="rejected"]').waitFor({ timeout: TIMEOUT });
  await waitCells(page, t => t.some(x => x.includes('Review me')), 'kept');
  log('rejected-delete');

  // Accept the insert with "run after insert": the new cell is there and has run.
  await row(1).locator('.jp-Kaizen-runAfter input').check();
  await row(1).locator('.jp-Kaizen-acceptCell').click();
  await page.locator('.jp-Kaizen-proposedCell[data-ordinal="1"][data-state="applied"]').waitFor({ timeout: TIMEOUT });
  await waitCells(page, t => t.length === 4 && t[2].includes("inserted ran"), 'inserted');
  await page.locator('.jp-NotebookPanel .jp-OutputArea-output', { hasText: 'inserted ran' }).waitFor({ timeout: TIMEOUT });
  log('accepted-insert-and-ran');
  await page.screenshot({ path: path.join(shots, 'notebook-accepted.png') });

  // Undo the replacement: the cell is back as it was.
  await row(0).locator('.jp-Kaizen-undoCell').click();
  await page.locator('.jp-Kaizen-proposedCell[data-ordinal="0"][data-state="undone"]').waitFor({ timeout: TIMEOUT });
  const afterUndo = await waitCells(page, t => !t.some(x => x.includes('x * 2')) && t.some(x => x.trim() === 'print(x)'), 'undone');
  log('undone', { cells: afterUndo.length });

  // Kernel access: the member's own permission, shown and changed here.
  const access = page.locator('.jp-Kaizen-kernelAccess input');
  await access.click();
  await page.waitForFunction(() => document.querySelector('.jp-Kaizen-kernelAccess input')?.checked === true, null, { timeout: TIMEOUT });
  log('kernel-access-allowed');
  await page.screenshot({ path: path.join(shots, 'notebook-undone.png') });
  await access.click();
  await page.waitForFunction(() => document.querySelector('.jp-Kaizen-kernelAccess input')?.checked === false, null, { timeout: TIMEOUT });
  log('kernel-access-revoked');

  if (errors.length) {
    throw new Error(`page errors: ${errors.join(' | ').slice(0, 500)}`);
  }
  const conversationId = await page.locator('.jp-Kaizen-chat').getAttribute('data-conversation-id');
  log('done', { conversationId });
}, { shots, failureShot: 'notebook-failure.png' });
