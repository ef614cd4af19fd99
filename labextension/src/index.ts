import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { KaizenApi } from './api';
import { ICodeActions } from './components/Markdown';
import { KaizenPanel } from './panel';
import { connectSettings } from './settings';

/** The plugin id; the settings and layout keys derive from it. */
export const PLUGIN_ID = 'kaizen-jupyter:plugin';

const PANEL_ID = 'kaizen-panel';

namespace CommandIDs {
  export const open = 'kaizen:open';
}

export const kaizenIcon = new LabIcon({
  name: 'kaizen-jupyter:kaizen',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M12 2a10 10 0 1 0 10 10h-2a8 8 0 1 1-2.34-5.66L15 9h7V2l-2.93 2.93A9.97 9.97 0 0 0 12 2z"/>' +
    '<circle cx="12" cy="12" r="3"/>' +
    '</g></svg>'
});

/** "Insert into notebook": a new code cell below the active cell of the current notebook. */
function codeActions(app: JupyterFrontEnd, tracker: INotebookTracker | null): ICodeActions {
  return {
    insert: (code: string) => {
      const panel = tracker?.currentWidget;
      if (!panel) {
        return 'Open a notebook first.';
      }
      const notebook = panel.content;
      NotebookActions.insertBelow(notebook);
      const cell = notebook.activeCell;
      if (!cell) {
        return 'The notebook has no active cell.';
      }
      cell.model.sharedModel.setSource(code.replace(/\n$/, ''));
      app.shell.activateById(panel.id);
      return null;
    }
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The Kaizen side panel: chat with agents, tool activity, approvals.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [ILayoutRestorer, INotebookTracker, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    rendermime: IRenderMimeRegistry,
    restorer: ILayoutRestorer | null,
    tracker: INotebookTracker | null,
    registry: ISettingRegistry | null
  ): void => {
    const api = new KaizenApi(app.serviceManager.serverSettings);
    const panel = new KaizenPanel({ api, rendermime, codeActions: codeActions(app, tracker) });
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

    if (registry) {
      void registry
        .load(PLUGIN_ID)
        .then(settings => connectSettings(settings, api, panel.model))
        .catch(reason => console.warn('Kaizen: settings unavailable', reason));
    }
  }
};

export default plugin;
