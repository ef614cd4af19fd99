/**
 * JupyterLab settings (schema/plugin.json) ↔ the panel preferences, and the member's server
 * settings (approval mode, tool-result compression) ↔ `members/me/settings`.
 *
 * The server holds those two (they apply in every browser). When JupyterLab starts, the
 * server's values are written into the settings registry; afterwards, a change made in the
 * Settings Editor is PUT to the server and reverted with a message if the server refuses it.
 * The PUT replaces the whole settings object, so it always carries the server's last values
 * for what did not change (the member's model choice among them): changing one setting never
 * resets another.
 */
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { APPROVAL_MODES, ApprovalMode, IMemberSettings, KaizenApi } from './api';
import { PanelModel } from './model';

export function readPreferences(settings: ISettingRegistry.ISettings): {
  defaultAgent: string;
  approvalMode: ApprovalMode | '';
  sendKey: 'Enter' | 'Mod+Enter';
} {
  const agent = settings.get('defaultAgent').composite;
  const mode = settings.get('approvalMode').composite;
  const key = settings.get('sendKey').composite;
  return {
    defaultAgent: typeof agent === 'string' ? agent : '',
    approvalMode: APPROVAL_MODES.includes(mode as ApprovalMode) ? (mode as ApprovalMode) : '',
    sendKey: key === 'Mod+Enter' ? 'Mod+Enter' : 'Enter'
  };
}

/** The server-held settings as the registry holds them now (null: not a valid value). */
function wantedOnServer(
  settings: ISettingRegistry.ISettings
): { approval_mode: ApprovalMode | null; tool_result_compression: boolean | null } {
  const mode = readPreferences(settings).approvalMode;
  const compression = settings.get('toolResultCompression').composite;
  return {
    approval_mode: mode || null,
    tool_result_compression: typeof compression === 'boolean' ? compression : null
  };
}

export async function connectSettings(
  settings: ISettingRegistry.ISettings,
  api: KaizenApi,
  panel: PanelModel
): Promise<void> {
  let server: IMemberSettings | null = null;
  let applyingServer = false;

  const applyServer = async (values: IMemberSettings): Promise<void> => {
    applyingServer = true;
    try {
      if (readPreferences(settings).approvalMode !== values.approval_mode) {
        await settings.set('approvalMode', values.approval_mode);
      }
      if (settings.get('toolResultCompression').composite !== values.tool_result_compression) {
        await settings.set('toolResultCompression', values.tool_result_compression);
      }
    } finally {
      applyingServer = false;
    }
  };

  const onChange = (): void => {
    panel.preferences.update(readPreferences(settings));
    if (applyingServer || server === null) {
      return;
    }
    const wanted = wantedOnServer(settings);
    const next: IMemberSettings = {
      ...server,
      approval_mode: wanted.approval_mode ?? server.approval_mode,
      tool_result_compression: wanted.tool_result_compression ?? server.tool_result_compression
    };
    if (
      next.approval_mode === server.approval_mode &&
      next.tool_result_compression === server.tool_result_compression
    ) {
      return;
    }
    const previous = server;
    server = next; // a second change before the answer builds on this one
    void api.putMemberSettings(next).then(result => {
      if (result.ok) {
        server = result.value;
        return;
      }
      server = previous;
      panel.reportError(`Your settings were not saved: ${result.message}`);
      void applyServer(previous);
    });
  };

  panel.preferences.update(readPreferences(settings));
  settings.changed.connect(onChange);

  const current = await api.memberSettings();
  if (!current.ok) {
    console.warn('Kaizen: member settings unavailable; approval mode and compression not synced');
    return;
  }
  await applyServer(current.value);
  server = current.value;
}
