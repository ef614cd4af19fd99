// Drives the credential form in headless Chromium with playwright-core (from labextension's
// devDependencies). Started by tests/e2e/test_credential_form.py with a running server and an
// issued form; prints one JSON line per step and exits non-zero on the first failure.
//
// env: KAIZEN_E2E_FORM_URL (absolute), KAIZEN_E2E_TOKEN (the form's member), KAIZEN_E2E_OTHER_TOKEN
//      (another member), KAIZEN_E2E_SECRET (what the member types), KAIZEN_E2E_ORIGIN (the
//      destination origin the page must show first), KAIZEN_E2E_SCREENSHOTS (dir),
//      KAIZEN_E2E_CHROMIUM (default /usr/bin/chromium)
import path from 'node:path';

import { check, here, log, runDriver } from './driver_kit.mjs';

const formUrl = process.env.KAIZEN_E2E_FORM_URL;
const token = process.env.KAIZEN_E2E_TOKEN;
const otherToken = process.env.KAIZEN_E2E_OTHER_TOKEN;
const secret = process.env.KAIZEN_E2E_SECRET;
const origin = process.env.KAIZEN_E2E_ORIGIN;
const shots = process.env.KAIZEN_E2E_SCREENSHOTS || here;
const TIMEOUT = 60000;

await runDriver(async browser => {
  // Another member opening the link sees a refusal and no input at all.
  const intruder = await browser.newPage();
  const refusedAnswer = await intruder.goto(`${formUrl}?token=${otherToken}`);
  check(refusedAnswer.status() === 404, `another member got ${refusedAnswer.status()}`);
  check((await intruder.locator('input[type=password]').count()) === 0, 'intruder saw inputs');
  log('other_member_refused', { status: refusedAnswer.status() });
  await intruder.close();

  const page = await browser.newPage();
  const opened = await page.goto(`${formUrl}?token=${token}`, { waitUntil: 'domcontentloaded' });
  check(opened.status() === 200, `form answered ${opened.status()}`);
  const shown = page.locator('#destination-origin');
  await shown.waitFor({ timeout: TIMEOUT });
  const shownOrigin = (await shown.textContent()).trim();
  check(shownOrigin === origin, `the page shows ${shownOrigin}, not ${origin}`);
  const input = page.locator('#kz-value');
  // The origin precedes every input in the document and sits above it on screen.
  const precedes = await page.evaluate(() => {
    const o = document.getElementById('destination-origin');
    const i = document.querySelector('input[type=password], input[type=text]');
    return Boolean(o.compareDocumentPosition(i) & Node.DOCUMENT_POSITION_FOLLOWING);
  });
  check(precedes, 'an input comes before the destination origin');
  const originBox = await shown.boundingBox();
  const inputBox = await input.boundingBox();
  check(originBox.y + originBox.height <= inputBox.y, 'the origin is not above the input');
  check(await input.getAttribute('type') === 'password', 'the value is not masked');
  log('origin_first', { origin: shownOrigin, origin_y: originBox.y, input_y: inputBox.y });
  await page.screenshot({ path: path.join(shots, 'credential-form.png') });

  await input.fill(secret);
  await Promise.all([
    page.waitForNavigation({ timeout: TIMEOUT }),
    page.locator('#kz-credential-form button[type=submit]').click()
  ]);
  const refLocator = page.locator('#kz-credential-ref');
  await refLocator.waitFor({ timeout: TIMEOUT });
  const ref = (await refLocator.textContent()).trim();
  const answerHtml = await page.content();
  check(!answerHtml.includes(secret), 'the answer page shows the value');
  check((await page.locator('input[type=password]').count()) === 0, 'the value field stayed');
  log('submitted', { credential_ref: ref });
  await page.screenshot({ path: path.join(shots, 'credential-saved.png') });

  // The link is spent: opening it again refuses, and resubmitting stores nothing.
  const again = await page.goto(`${formUrl}?token=${token}`);
  check(again.status() === 409, `a used form answered ${again.status()}`);
  const code = await page.locator('#kz-refused').getAttribute('data-code');
  check(code === 'form_used', `a used form said ${code}`);
  log('replay_refused', { status: again.status(), code });
  const resubmitted = await page.evaluate(async ({ url, secret }) => {
    const response = await fetch(url, {
      method: 'POST', body: new URLSearchParams({ value: secret }),
      headers: { 'Content-Type': 'application/x-www-form-urlencoded' }
    });
    return response.status;
  }, { url: `${formUrl}?token=${token}`, secret: `${secret}-again` });
  check(resubmitted === 409 || resubmitted === 403, `a resubmission answered ${resubmitted}`);
  log('resubmission_refused', { status: resubmitted });
}, { shots });
