// Drives the panel's "Credential required" card in headless Chromium with playwright-core
// (from labextension's devDependencies). Started by tests/e2e/test_credential_card.py with a
// Jupyter server whose conversation has a call paused for a credential; prints one JSON line
// per step and exits non-zero on the first failure.
//
// env: KAIZEN_E2E_BASE_URL (ends with '/'), KAIZEN_E2E_TOKEN, KAIZEN_E2E_CONVERSATION (the
//      conversation with the paused call), KAIZEN_E2E_ORIGIN (the destination origin the card
//      and the form must show), KAIZEN_E2E_SECRET (what the member types),
//      KAIZEN_E2E_SCREENSHOTS (dir), KAIZEN_E2E_CHROMIUM (default /usr/bin/chromium)
import path from 'node:path';

import { check, here, log, openPanel, runDriver } from './driver_kit.mjs';

const base = process.env.KAIZEN_E2E_BASE_URL;
const token = process.env.KAIZEN_E2E_TOKEN;
const conversation = process.env.KAIZEN_E2E_CONVERSATION;
const origin = process.env.KAIZEN_E2E_ORIGIN;
const secret = process.env.KAIZEN_E2E_SECRET;
const shots = process.env.KAIZEN_E2E_SCREENSHOTS || here;
const TIMEOUT = 60000;
await runDriver(async browser => {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', e => errors.push(String(e)));
  await openPanel(page, base, token, TIMEOUT);
  await page.locator(`.jp-Kaizen-conversation[data-conversation-id="${conversation}"]`).click();
  const card = page.locator('.jp-Kaizen-credential');
  await card.waitFor({ timeout: TIMEOUT });
  check((await card.getAttribute('data-status')) === 'pending', 'the card is not pending');
  const shown = (await card.locator('.jp-Kaizen-credentialOrigin').textContent()).trim();
  check(shown === origin, `the card shows ${shown}, not ${origin}`);
  const status = (await page.locator('.jp-Kaizen-runStatus').textContent()).trim();
  check(status.includes('Waiting for a credential'), `the run status says ${status}`);
  log('card-seen', { origin: shown });
  await page.screenshot({ path: path.join(shots, 'credential-card.png') });

  // "Enter credential" opens the signed form in a new tab, the origin first.
  const link = card.locator('a.jp-Kaizen-enterCredential');
  const href = await link.getAttribute('href');
  check(href.includes('/kaizen/credentials/forms/'), `the link goes to ${href}`);
  const [form] = await Promise.all([context.waitForEvent('page'), link.click()]);
  await form.waitForLoadState('domcontentloaded');
  const formOrigin = form.locator('#destination-origin');
  await formOrigin.waitFor({ timeout: TIMEOUT });
  check((await formOrigin.textContent()).trim() === origin, 'the form shows another origin');
  const precedes = await form.evaluate(() => {
    const o = document.getElementById('destination-origin');
    const i = document.querySelector('input[type=password], input[type=text]');
    return Boolean(o.compareDocumentPosition(i) & Node.DOCUMENT_POSITION_FOLLOWING);
  });
  check(precedes, 'an input comes before the destination origin');
  log('form-opened', { origin });
  await form.locator('#kz-value').fill(secret);
  await Promise.all([
    form.waitForNavigation({ timeout: TIMEOUT }),
    form.locator('#kz-credential-form button[type=submit]').click()
  ]);
  await form.locator('#kz-saved[data-resumed="yes"]').waitFor({ timeout: TIMEOUT });
  check(!(await form.content()).includes(secret), 'the answer page shows the value');
  log('form-submitted');
  await form.close();

  // The card resolves from credential.settled, and the run completes with the call's result.
  await page.locator('.jp-Kaizen-credential[data-status="submitted"]').waitFor({ timeout: TIMEOUT });
  await page.locator('.jp-Kaizen-run[data-status="completed"]').waitFor({ timeout: TIMEOUT });
  const panelText = await page.locator('#kaizen-panel').textContent();
  check(!panelText.includes(secret), 'the panel shows the value');
  log('card-resolved');
  await page.screenshot({ path: path.join(shots, 'credential-card-resolved.png') });
  if (errors.length) {
    throw new Error(`page errors: ${errors.join(' | ').slice(0, 500)}`);
  }
  log('done');
}, { shots });
