/**
 * JupyterLab settings (schema/plugin.json) ↔ the panel preferences, and the approval mode
 * ↔ `members/me/settings` on the server.
 *
 * The server holds the member's approval mode (it applies to every browser). When
 * JupyterLab starts, the server's value is written into the settings registry; afterwards,
 * a change made in the Settings Editor is PUT to the server, and reverted with a message if
 * the server refuses it.
 */
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { APPROVAL_MODES, ApprovalMode, KaizenApi } from './api';
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

export async function connectSettings(
  settings: ISettingRegistry.ISettings,
  api: KaizenApi,
  panel: PanelModel
): Promise<void> {
  let serverMode: ApprovalMode | null = null;
  let applyingServer = false;

  const onChange = (): void => {
    const prefs = readPreferences(settings);
    panel.preferences.update(prefs);
    if (applyingServer || serverMode === null || !prefs.approvalMode) {
      return;
    }
    if (prefs.approvalMode === serverMode) {
      return;
    }
    const wanted = prefs.approvalMode;
    void api.putMemberSettings({ approval_mode: wanted }).then(result => {
      if (result.ok) {
        serverMode = result.value.approval_mode;
        return;
      }
      panel.reportError(`Your approval mode was not saved: ${result.message}`);
      applyingServer = true;
      void settings.set('approvalMode', serverMode as ApprovalMode).finally(() => {
        applyingServer = false;
      });
    });
  };

  panel.preferences.update(readPreferences(settings));
  settings.changed.connect(onChange);

  const current = await api.memberSettings();
  if (!current.ok) {
    console.warn('Kaizen: member settings unavailable; approval mode not synced');
    return;
  }
  serverMode = current.value.approval_mode;
  if (readPreferences(settings).approvalMode !== serverMode) {
    applyingServer = true;
    try {
      await settings.set('approvalMode', serverMode);
    } finally {
      applyingServer = false;
    }
  }
}
