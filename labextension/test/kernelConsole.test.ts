import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  IConsoleKernel,
  IConversationKernel,
  parseConsoleKernel,
  parseConversationKernel,
  Result
} from '../src/api';
import {
  consoleButton,
  DISABLED_HINT,
  KernelConsoleModel,
  NO_KERNEL_HINT,
  phaseOf
} from '../src/kernelConsole';

const KERNEL_ID = '0b7f3c1e-8f55-4c3b-9d7e-5a1f2b3c4d5e';

/** A fake Kaizen API for one conversation: its kernel status and console answers. */
function fakeApi(options: {
  status?: Result<IConversationKernel>[];
  open?: Result<IConsoleKernel>;
}) {
  const calls: string[] = [];
  const statuses = [...(options.status ?? [])];
  const api = {
    conversationKernel: (id: string): Promise<Result<IConversationKernel>> => {
      calls.push(`GET ${id}`);
      return Promise.resolve(
        statuses.shift() ?? { ok: true, value: { console_enabled: true, kernels: [] } }
      );
    },
    openKernelConsole: (id: string, language?: string): Promise<Result<IConsoleKernel>> => {
      calls.push(`POST ${id} ${language}`);
      return Promise.resolve(
        options.open ?? {
          ok: true,
          value: { kernel_id: KERNEL_ID, kernel_name: 'python3', language: 'python' }
        }
      );
    }
  };
  return { api, calls };
}

const withKernel: Result<IConversationKernel> = {
  ok: true,
  value: {
    console_enabled: true,
    kernels: [{ language: 'python', kernel_name: 'python3', busy: false, console_kernel_id: null }]
  }
};

describe('reading the kernel routes', () => {
  it('reads the status defensively', () => {
    assert.deepEqual(
      parseConversationKernel({
        console_enabled: true,
        kernels: [
          { language: 'python', kernel_name: 'python3', busy: true, console_kernel_id: KERNEL_ID },
          { nope: 1 }
        ]
      }),
      {
        console_enabled: true,
        kernels: [
          { language: 'python', kernel_name: 'python3', busy: true, console_kernel_id: KERNEL_ID }
        ]
      }
    );
    assert.equal(parseConversationKernel({ console_enabled: true }), null);
    assert.equal(parseConversationKernel(null), null);
  });

  it('hands JupyterLab only a kernel id shaped like one', () => {
    assert.deepEqual(parseConsoleKernel({ kernel_id: KERNEL_ID, kernel_name: 'python3', language: 'python' }), {
      kernel_id: KERNEL_ID,
      kernel_name: 'python3',
      language: 'python'
    });
    for (const kernel_id of ['../../api/kernels', '', 42, `${KERNEL_ID}/channels`]) {
      assert.equal(parseConsoleKernel({ kernel_id }), null, String(kernel_id));
    }
  });

  it('says whether a console can open', () => {
    assert.equal(phaseOf(withKernel.ok ? withKernel.value : { console_enabled: true, kernels: [] }), 'ready');
    assert.equal(phaseOf({ console_enabled: true, kernels: [] }), 'none');
    assert.equal(
      phaseOf({ console_enabled: false, kernels: [{ language: 'python', kernel_name: '', busy: false, console_kernel_id: null }] }),
      'disabled'
    );
    assert.deepEqual(consoleButton({ phase: 'none', opening: false, message: null }), {
      enabled: false,
      title: NO_KERNEL_HINT
    });
    assert.deepEqual(consoleButton({ phase: 'disabled', opening: false, message: null }), {
      enabled: false,
      title: DISABLED_HINT
    });
    assert.equal(consoleButton({ phase: 'ready', opening: false, message: null }).enabled, true);
    assert.equal(consoleButton({ phase: 'ready', opening: true, message: null }).enabled, false);
  });
});

describe('KernelConsoleModel', () => {
  it('enables the action once the server reports my persistent kernel', async () => {
    const { api, calls } = fakeApi({ status: [{ ok: true, value: { console_enabled: true, kernels: [] } }, withKernel] });
    const model = new KernelConsoleModel(api, 'c1');
    assert.equal(model.getSnapshot().phase, 'checking');
    await model.refresh();
    assert.equal(model.getSnapshot().phase, 'none');
    await model.refresh();
    assert.equal(model.getSnapshot().phase, 'ready');
    assert.deepEqual(calls, ['GET c1', 'GET c1']);
  });

  it('attaches on the server, then opens the console on that kernel id', async () => {
    const { api, calls } = fakeApi({ status: [withKernel] });
    const model = new KernelConsoleModel(api, 'c1');
    await model.refresh();
    const launched: string[] = [];
    const failure = await model.open(kernel => {
      launched.push(kernel.kernel_id);
      return Promise.resolve(null);
    });
    assert.equal(failure, null);
    assert.deepEqual(launched, [KERNEL_ID]);
    assert.deepEqual(calls, ['GET c1', 'POST c1 python']);
    assert.deepEqual(model.getSnapshot(), { phase: 'ready', opening: false, message: null });
  });

  it("shows the server's sentence and never launches when there is no kernel", async () => {
    const message = 'You have no persistent run_code kernel in this conversation.';
    const { api } = fakeApi({ status: [withKernel], open: { ok: false, status: 404, message } });
    const model = new KernelConsoleModel(api, 'c1');
    await model.refresh();
    let launched = false;
    const failure = await model.open(() => {
      launched = true;
      return Promise.resolve(null);
    });
    assert.equal(failure, message);
    assert.equal(launched, false);
    assert.deepEqual(model.getSnapshot(), { phase: 'none', opening: false, message });
    model.dismiss();
    assert.equal(model.getSnapshot().message, null);
  });

  it('reports a console that JupyterLab could not open', async () => {
    const { api } = fakeApi({ status: [withKernel] });
    const model = new KernelConsoleModel(api, 'c1');
    await model.refresh();
    assert.equal(await model.open(() => Promise.reject(new Error('boom: stack'))), 'JupyterLab could not open the console.');
    assert.equal(await model.open(() => Promise.resolve('The JupyterLab console is not available in this JupyterLab.')), 'The JupyterLab console is not available in this JupyterLab.');
    assert.equal(model.getSnapshot().opening, false);
  });

  it('keeps the newest status when answers cross', async () => {
    let release: (value: Result<IConversationKernel>) => void = () => undefined;
    const slow = new Promise<Result<IConversationKernel>>(resolve => (release = resolve));
    let first = true;
    const api = {
      conversationKernel: () => {
        if (first) {
          first = false;
          return slow;
        }
        return Promise.resolve(withKernel);
      },
      openKernelConsole: () => Promise.reject(new Error('unused'))
    };
    const model = new KernelConsoleModel(api, 'c1');
    const older = model.refresh();
    await model.refresh();
    release({ ok: true, value: { console_enabled: true, kernels: [] } });
    await older;
    assert.equal(model.getSnapshot().phase, 'ready');
  });
});
