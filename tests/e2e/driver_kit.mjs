// What every Chromium driver here shares: playwright-core (from labextension's
// devDependencies), the headless browser, one JSON line per step, the failure report and
// opening the Kaizen panel.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', '..', 'labextension', 'package.json'));
const { chromium } = require('playwright-core');

const started = Date.now();

export function log(step, extra = {}) {
  console.log(JSON.stringify({ step, ms: Date.now() - started, ...extra }));
}

export function check(condition, message) {
  if (!condition) {
    throw new Error(message);
  }
}

// Runs `body(browser)` in headless Chromium (KAIZEN_E2E_CHROMIUM, default /usr/bin/chromium).
// A failure prints a `failed` step, screenshots the last page to `shots/failureShot` and sets
// a non-zero exit code; the browser is closed either way.
export async function runDriver(body, { shots, failureShot = 'failure.png' }) {
  const browser = await chromium.launch({
    executablePath: process.env.KAIZEN_E2E_CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']
  });
  try {
    await body(browser);
  } catch (error) {
    console.log(JSON.stringify({ step: 'failed', error: String(error?.stack ?? error).slice(0, 2000) }));
    try {
      const pages = browser.contexts().flatMap(c => c.pages());
      if (pages.length) {
        await pages.at(-1).screenshot({ path: path.join(shots, failureShot) });
      }
    } catch {
      // best effort
    }
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}

// Opens JupyterLab at `base` with `token` and shows the Kaizen panel.
export async function openPanel(page, base, token, timeout) {
  await page.goto(`${base}lab?token=${token}`, { waitUntil: 'domcontentloaded' });
  const tab = page.locator('.jp-SideBar.jp-mod-right li[data-id="kaizen-panel"]');
  await tab.waitFor({ timeout });
  // The restored layout may open the panel a moment after the tab shows: a click then would
  // close it again, so check (and click) until it stays visible.
  const panel = page.locator('#kaizen-panel');
  for (let attempt = 0; attempt < 5; attempt++) {
    try {
      await panel.waitFor({ state: 'visible', timeout: attempt ? 3000 : 1000 });
      return;
    } catch {
      await tab.click();
    }
  }
  await panel.waitFor({ state: 'visible', timeout });
}
