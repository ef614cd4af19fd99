// Opens JupyterLab in headless Chromium and waits for the Kaizen panel to show, then sends
// one message and waits for its answer. Started by tests/distribution/test_wheel.py against
// a server installed from the wheel; playwright-core comes from labextension's
// devDependencies (this driver's Node.js is the test's, not the server's).
// env: KAIZEN_E2E_BASE_URL (ends with '/'), KAIZEN_E2E_TOKEN, KAIZEN_E2E_CHROMIUM,
//      KAIZEN_E2E_SCREENSHOTS (dir)
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', '..', 'labextension', 'package.json'));
const { chromium } = require('playwright-core');

const base = process.env.KAIZEN_E2E_BASE_URL;
const token = process.env.KAIZEN_E2E_TOKEN;
const shots = process.env.KAIZEN_E2E_SCREENSHOTS || here;
const TIMEOUT = 90000; // generous: a shared two-core machine

const browser = await chromium.launch({
  executablePath: process.env.KAIZEN_E2E_CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']
});
const errors = [];
let page;
try {
  page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('pageerror', e => errors.push(String(e)));
  await page.goto(`${base}lab?token=${token}`, { waitUntil: 'domcontentloaded' });
  const tab = page.locator('.jp-SideBar.jp-mod-right li[data-id="kaizen-panel"]');
  await tab.waitFor({ timeout: TIMEOUT });
  const panel = page.locator('#kaizen-panel');
  for (let attempt = 0; attempt < 5 && !(await panel.isVisible()); attempt++) {
    await tab.click();
    await page.waitForTimeout(1000);
  }
  await panel.waitFor({ state: 'visible', timeout: TIMEOUT });
  console.log(JSON.stringify({ step: 'panel-open' }));
  await page.waitForFunction(
    () => document.querySelectorAll('.jp-Kaizen-newChat select option').length > 0,
    null,
    { timeout: TIMEOUT }
  );
  await page.locator('.jp-Kaizen-newChat select').selectOption('general');
  await page.getByRole('button', { name: 'New chat' }).click();
  await page.locator('.jp-Kaizen-feed[data-phase="live"]').waitFor({ timeout: TIMEOUT });
  const box = page.locator('.jp-Kaizen-textarea');
  await box.fill('hello from the wheel');
  await box.press('Enter');
  await page.getByText('Hello from the installed wheel.').first().waitFor({ timeout: TIMEOUT });
  console.log(JSON.stringify({ step: 'answered' }));
  await page.screenshot({ path: path.join(shots, 'wheel-panel.png') });
  if (errors.length) {
    throw new Error(`page errors: ${errors.join('; ')}`);
  }
  console.log(JSON.stringify({ step: 'done' }));
} catch (error) {
  if (page) {
    await page.screenshot({ path: path.join(shots, 'wheel-panel-failed.png') }).catch(() => {});
  }
  console.error(String(error && error.stack || error));
  process.exitCode = 1;
} finally {
  await browser.close();
}
