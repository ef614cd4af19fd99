import assert from 'node:assert/strict';
import { it } from 'node:test';

import type { ISettingRegistry } from '@jupyterlab/settingregistry';

import { ApprovalMode, IMemberSettings, KaizenApi, Result } from '../src/api';
import { PanelModel } from '../src/model';
import { connectSettings } from '../src/settings';

/** Just enough of ISettings: composite values, set(), and the changed signal. */
function fakeSettings(values: Record<string, unknown>) {
  const slots: Array<() => void> = [];
  const settings = {
    get: (key: string) => ({ composite: values[key], user: values[key] }),
    set: async (key: string, value: unknown) => {
      values[key] = value;
      slots.forEach(slot => slot());
    },
    changed: { connect: (slot: () => void) => slots.push(slot) }
  };
  return { settings: settings as unknown as ISettingRegistry.ISettings, values };
}

type PutBody = { approval_mode: ApprovalMode; model?: string | null; tool_result_compression?: boolean };

function fakeApi(server: IMemberSettings & { refuse?: boolean }) {
  const puts: PutBody[] = [];
  const api = {
    memberSettings: async (): Promise<Result<IMemberSettings>> => ({ ok: true, value: { ...server } }),
    putMemberSettings: async (body: PutBody): Promise<Result<IMemberSettings>> => {
      puts.push(body);
      if (server.refuse) {
        return { ok: false, message: 'Not allowed.', status: 422 };
      }
      // A PUT replaces the whole object, as the server does: what is omitted is reset.
      server.approval_mode = body.approval_mode;
      server.model = body.model ?? null;
      server.tool_result_compression = body.tool_result_compression === true;
      return { ok: true, value: { ...server } };
    }
  };
  return { api: api as unknown as KaizenApi, puts };
}

const tick = () => new Promise(resolve => setImmediate(resolve));

it('loads the server approval mode into the registry, then saves changes to the server', async () => {
  const { settings, values } = fakeSettings({ defaultAgent: 'search', approvalMode: 'ask_for_writes', sendKey: 'Mod+Enter' });
  const server = { approval_mode: 'never_ask' as ApprovalMode, model: null, tool_result_compression: false };
  const { api, puts } = fakeApi(server);
  const panel = new PanelModel(api);
  await connectSettings(settings, api, panel);
  assert.equal(values.approvalMode, 'never_ask');
  assert.equal(puts.length, 0, 'loading the server value writes nothing back');
  assert.equal(panel.preferences.getSnapshot().sendKey, 'Mod+Enter');
  assert.equal(panel.preferences.getSnapshot().defaultAgent, 'search');

  await settings.set('approvalMode', 'always_ask');
  await tick();
  assert.deepEqual(puts.map(p => p.approval_mode), ['always_ask']);
  assert.equal(server.approval_mode, 'always_ask');
});

it('changing one setting keeps the member\'s model and compression choice', async () => {
  const { settings, values } = fakeSettings({ approvalMode: 'ask_for_writes', sendKey: 'Enter', defaultAgent: '', toolResultCompression: false });
  const server = { approval_mode: 'ask_for_writes' as ApprovalMode, model: 'big-model', tool_result_compression: true };
  const { api, puts } = fakeApi(server);
  const panel = new PanelModel(api);
  await connectSettings(settings, api, panel);
  assert.equal(values.toolResultCompression, true, 'the server\'s opt-in is loaded');
  assert.equal(puts.length, 0);

  await settings.set('approvalMode', 'never_ask');
  await tick();
  assert.deepEqual(server, { approval_mode: 'never_ask', model: 'big-model', tool_result_compression: true });

  await settings.set('toolResultCompression', false);
  await tick();
  assert.equal(puts.length, 2);
  assert.deepEqual(server, { approval_mode: 'never_ask', model: 'big-model', tool_result_compression: false });
});

it('reverts the registry and tells the member when the server refuses', async () => {
  const { settings, values } = fakeSettings({ approvalMode: 'ask_for_writes', sendKey: 'Enter', defaultAgent: '', toolResultCompression: false });
  const server = { approval_mode: 'ask_for_writes' as ApprovalMode, model: null, tool_result_compression: false, refuse: true };
  const { api } = fakeApi(server);
  const panel = new PanelModel(api);
  await connectSettings(settings, api, panel);
  await settings.set('approvalMode', 'never_ask');
  await tick();
  await tick();
  assert.equal(values.approvalMode, 'ask_for_writes');
  assert.match(panel.getSnapshot().error ?? '', /not saved: Not allowed\./);

  await settings.set('toolResultCompression', true);
  await tick();
  await tick();
  assert.equal(values.toolResultCompression, false);
});
