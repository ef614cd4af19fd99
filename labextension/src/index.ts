import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { LabIcon } from '@jupyterlab/ui-components';

import { KaizenPanel } from './panel';

/** The plugin id; the settings and layout keys derive from it. */
export const PLUGIN_ID = 'kaizen-jupyter:plugin';

const PANEL_ID = 'kaizen-panel';

namespace CommandIDs {
  export const open = 'kaizen:open';
}

const kaizenIcon = new LabIcon({
  name: 'kaizen-jupyter:kaizen',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M12 2a10 10 0 1 0 10 10h-2a8 8 0 1 1-2.34-5.66L15 9h7V2l-2.93 2.93A9.97 9.97 0 0 0 12 2z"/>' +
    '<circle cx="12" cy="12" r="3"/>' +
    '</g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The Kaizen side panel: the agents the member can talk to.',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null): void => {
    const panel = new KaizenPanel(app.serviceManager.serverSettings);
    panel.id = PANEL_ID;
    panel.title.icon = kaizenIcon;
    panel.title.caption = 'Kaizen';
    app.shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open the Kaizen Panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });

    if (restorer) {
      restorer.add(panel, PANEL_ID);
    }
  }
};

export default plugin;
