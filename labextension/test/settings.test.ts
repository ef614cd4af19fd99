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

function fakeApi(server: { mode: ApprovalMode; refuse?: boolean }) {
  const puts: ApprovalMode[] = [];
  const api = {
    memberSettings: async (): Promise<Result<IMemberSettings>> => ({
      ok: true,
      value: { approval_mode: server.mode, model: null }
    }),
    putMemberSettings: async (body: { approval_mode: ApprovalMode }): Promise<Result<IMemberSettings>> => {
      puts.push(body.approval_mode);
      if (server.refuse) {
        return { ok: false, message: 'Not allowed.', status: 422 };
      }
      server.mode = body.approval_mode;
      return { ok: true, value: { approval_mode: server.mode, model: null } };
    }
  };
  return { api: api as unknown as KaizenApi, puts };
}

const tick = () => new Promise(resolve => setImmediate(resolve));

it('loads the server approval mode into the registry, then saves changes to the server', async () => {
  const { settings, values } = fakeSettings({ defaultAgent: 'search', approvalMode: 'ask_for_writes', sendKey: 'Mod+Enter' });
  const server = { mode: 'never_ask' as ApprovalMode };
  const { api, puts } = fakeApi(server);
  const panel = new PanelModel(api);
  await connectSettings(settings, api, panel);
  assert.equal(values.approvalMode, 'never_ask');
  assert.deepEqual(puts, [], 'loading the server value writes nothing back');
  assert.equal(panel.preferences.getSnapshot().sendKey, 'Mod+Enter');
  assert.equal(panel.preferences.getSnapshot().defaultAgent, 'search');

  await settings.set('approvalMode', 'always_ask');
  await tick();
  assert.deepEqual(puts, ['always_ask']);
  assert.equal(server.mode, 'always_ask');
});

it('reverts the registry and tells the member when the server refuses', async () => {
  const { settings, values } = fakeSettings({ approvalMode: 'ask_for_writes', sendKey: 'Enter', defaultAgent: '' });
  const server = { mode: 'ask_for_writes' as ApprovalMode, refuse: true };
  const { api } = fakeApi(server);
  const panel = new PanelModel(api);
  await connectSettings(settings, api, panel);
  await settings.set('approvalMode', 'never_ask');
  await tick();
  await tick();
  assert.equal(values.approvalMode, 'ask_for_writes');
  assert.match(panel.getSnapshot().error ?? '', /not saved: Not allowed\./);
});
