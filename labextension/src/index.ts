import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, InputDialog, Notification, showDialog } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { KaizenApi } from './api';
import { askMessage, askTitle, cellReference, ICellContext, quotedPart } from './ask';
import { ICodeActions } from './components/Markdown';
import { addJupyterDocuments, CitationOpener } from './documents';
import { DocumentsList } from './documentsList';
import { DocumentView, documentViewId } from './documentView';
import { IJupyterHost } from './jupyterHost';
import { ConsoleLauncher } from './kernelConsole';
import { registerNotebookCommands } from './notebook/commands';
import { JupyterNotebookEditor } from './notebook/editor';
import { KaizenPanel } from './panel';
import { connectSettings } from './settings';

/** The plugin id; the settings and layout keys derive from it. */
export const PLUGIN_ID = 'kaizen-jupyter:plugin';

const PANEL_ID = 'kaizen-panel';

namespace CommandIDs {
  export const open = 'kaizen:open';
  export const askAboutCell = 'kaizen:ask-about-cell';
  export const attachFile = 'kaizen:attach-file';
  export const addToDocuments = 'kaizen:add-to-documents';
  export const addNotebookToDocuments = 'kaizen:add-notebook-to-documents';
  export const openDocuments = 'kaizen:open-documents';
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
    insert: async (code: string) => {
      const panel = tracker?.currentWidget;
      if (!panel) {
        return 'Open a notebook first.';
      }
      // A notebook still loading from disk would replace a cell inserted now.
      await panel.context.ready;
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

/**
 * Opens JupyterLab's console on an existing kernel (the member's persistent run_code kernel,
 * attached by the server): `console:create` with `kernelPreference.id`, so the console's
 * session joins that kernel instead of starting one.
 */
function consoleLauncher(app: JupyterFrontEnd): ConsoleLauncher {
  return async kernel => {
    if (!app.commands.hasCommand('console:create')) {
      return 'The JupyterLab console is not available in this JupyterLab.';
    }
    try {
      await app.commands.execute('console:create', {
        name: 'Kaizen run_code kernel',
        kernelPreference: { id: kernel.kernel_id, shouldStart: true, canStart: true },
        activate: true
      });
      return null;
    } catch (reason) {
      console.warn('Kaizen: console:create failed', reason);
      return 'JupyterLab could not open the console.';
    }
  };
}

/**
 * The cell to ask about: the one right-clicked (context menu), else the active cell of the
 * current notebook; with the editor's selection, if any.
 */
function cellContext(app: JupyterFrontEnd, tracker: INotebookTracker | null): ICellContext | null {
  const panel: NotebookPanel | null = tracker?.currentWidget ?? null;
  if (!panel) {
    return null;
  }
  const notebook = panel.content;
  const hit = app.contextMenuHitTest(node => node.classList.contains('jp-Cell'));
  let index = hit ? notebook.widgets.findIndex(cell => cell.node === hit) : -1;
  if (index < 0) {
    index = notebook.activeCellIndex;
  }
  const cell = notebook.widgets[index];
  if (!cell) {
    return null;
  }
  let selection: ICellContext['selection'] = null;
  const editor = cell.editor;
  if (editor) {
    try {
      const range = editor.getSelection();
      selection = { start: editor.getOffsetAt(range.start), end: editor.getOffsetAt(range.end) };
    } catch {
      selection = null;
    }
  }
  const info = notebook.model?.getMetadata('language_info') as { name?: unknown } | undefined;
  const spec = notebook.model?.getMetadata('kernelspec') as { language?: unknown } | undefined;
  // The kernel's language; before a kernel reported it, the editor's MIME type says it.
  const mime = /^text\/x-(i?python|[a-z0-9+-]+)$/.exec(notebook.codeMimetype ?? '');
  const text = (v: unknown): string => (typeof v === 'string' ? v : '');
  const language =
    text(info?.name) || text(spec?.language) || (mime ? mime[1].replace(/^ipython$/, 'python') : '');
  return {
    path: panel.context.path,
    index,
    id: cell.model.id,
    cellType: cell.model.type,
    language,
    source: cell.model.sharedModel.getSource(),
    selection
  };
}

/** The files (not folders) selected in the default file browser, as contents API paths. */
function selectedFiles(browser: IDefaultFileBrowser | null): string[] {
  if (!browser) {
    return [];
  }
  return Array.from(browser.selectedItems())
    .filter(item => item.type !== 'directory')
    .map(item => item.path);
}

/** A citation opens its document version in the main area (one view per version, reused). */
function citationOpener(app: JupyterFrontEnd, api: KaizenApi): CitationOpener {
  const views = new Map<string, DocumentView>();
  const openPath = (path: string): void => {
    void app.commands.execute('docmanager:open', { path }).catch(reason => {
      console.warn('Kaizen: could not open the source file', reason);
      Notification.error(`JupyterLab could not open ${path}.`, { autoClose: 8000 });
    });
  };
  return (citation, label) => {
    const id = documentViewId(citation);
    let view = views.get(id);
    if (!view || view.isDisposed) {
      view = new DocumentView(citation, label, { api, openPath });
      views.set(id, view);
      view.disposed.connect(() => views.delete(id));
      app.shell.add(view, 'main', { mode: 'split-right' });
    }
    app.shell.activateById(view.id);
    void view.open(citation);
  };
}

/** Add paths to the member's Kaizen documents, one notification per file. */
async function addToDocuments(api: KaizenApi, paths: string[], list: DocumentsList | null): Promise<void> {
  for (const outcome of await addJupyterDocuments(api, paths)) {
    if (outcome.ok) {
      Notification.success(outcome.message, { autoClose: 5000 });
    } else {
      Notification.error(outcome.message, { autoClose: 8000 });
    }
  }
  if (list?.isAttached) {
    await list.refresh();
  }
}

async function confirmRemove(title: string): Promise<boolean> {
  const answer = await showDialog({
    title: 'Remove from Kaizen documents?',
    body: `"${title}" and all its versions are removed; rooms it was shared into lose it at once. The file in Jupyter stays.`,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Remove' })]
  });
  return answer.button.accept;
}

/** What the panel asks of JupyterLab: the folder to save next to (the notebook's first). */
function jupyterHost(
  tracker: INotebookTracker | null,
  browser: IDefaultFileBrowser | null
): IJupyterHost {
  return {
    currentFolder: () => {
      const notebook = tracker?.currentWidget?.context.path;
      if (notebook) {
        return notebook.includes('/') ? notebook.slice(0, notebook.lastIndexOf('/')) : '';
      }
      return browser?.model.path ?? '';
    }
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The Kaizen side panel: chat with agents, tool activity, approvals.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [
    ILayoutRestorer,
    INotebookTracker,
    ISettingRegistry,
    ICommandPalette,
    IDefaultFileBrowser
  ],
  activate: (
    app: JupyterFrontEnd,
    rendermime: IRenderMimeRegistry,
    restorer: ILayoutRestorer | null,
    tracker: INotebookTracker | null,
    registry: ISettingRegistry | null,
    palette: ICommandPalette | null,
    browser: IDefaultFileBrowser | null
  ): void => {
    const api = new KaizenApi(app.serviceManager.serverSettings);
    const openCitation = citationOpener(app, api);
    const panel = new KaizenPanel({
      api,
      rendermime,
      codeActions: codeActions(app, tracker),
      launchConsole: consoleLauncher(app),
      notebookEditor: tracker ? new JupyterNotebookEditor(app, tracker) : null,
      host: jupyterHost(tracker, browser),
      openCitation,
      openDocuments: () => void app.commands.execute(CommandIDs.openDocuments)
    });
    let documentsList: DocumentsList | null = null;
    panel.id = PANEL_ID;
    panel.title.icon = kaizenIcon;
    panel.title.caption = 'Kaizen';
    app.shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open the Kaizen Panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });

    // "Ask Kaizen about this cell / selection": a question (asked in a dialog unless given as
    // the `question` argument) with the selection, or the whole cell, and a reference to the
    // notebook and cell, sent into the open conversation or a new one.
    app.commands.addCommand(CommandIDs.askAboutCell, {
      label: args => {
        if (args.isPalette) {
          return 'Ask Kaizen About This Cell or Selection';
        }
        const context = cellContext(app, tracker);
        return context && quotedPart(context).selected
          ? 'Ask Kaizen About the Selection'
          : 'Ask Kaizen About This Cell';
      },
      caption: 'Send the selection (or the whole cell) with a reference to the notebook and cell to Kaizen',
      icon: args => (args.isPalette ? undefined : kaizenIcon),
      isEnabled: () => !!tracker?.currentWidget?.content.activeCell,
      execute: async args => {
        const context = cellContext(app, tracker);
        if (!context) {
          return;
        }
        let question = typeof args.question === 'string' ? args.question : null;
        if (question === null) {
          const answer = await InputDialog.getText({
            title: quotedPart(context).selected
              ? 'Ask Kaizen about the selection'
              : 'Ask Kaizen about this cell',
            label: `About ${cellReference(context).replace(/`/g, '')}`,
            placeholder: 'Your question (empty: explain this code)',
            okLabel: 'Ask'
          });
          if (!answer.button.accept) {
            return;
          }
          question = answer.value ?? '';
        }
        app.shell.activateById(PANEL_ID);
        await panel.model.ask(askMessage(question, context), askTitle(context));
      }
    });
    app.contextMenu.addItem({
      command: CommandIDs.askAboutCell,
      selector: '.jp-Notebook .jp-Cell',
      rank: 20
    });
    palette?.addItem({
      command: CommandIDs.askAboutCell,
      category: 'Kaizen',
      args: { isPalette: true }
    });
    palette?.addItem({ command: CommandIDs.open, category: 'Kaizen' });
    if (tracker) {
      registerNotebookCommands({ app, tracker, model: panel.model, icon: kaizenIcon, panelId: PANEL_ID, palette });
    }

    // "Attach to Kaizen" on files of the file browser: the server reads each one through its
    // ContentsManager onto the next message of the open conversation (or a new one).
    app.commands.addCommand(CommandIDs.attachFile, {
      label: 'Attach to Kaizen',
      caption: 'Put this file on your next Kaizen message (run_code reads it by its name)',
      icon: kaizenIcon,
      isVisible: () => selectedFiles(browser).length > 0,
      execute: async args => {
        const paths =
          typeof args.path === 'string' ? [args.path] : selectedFiles(browser);
        if (!paths.length) {
          return;
        }
        app.shell.activateById(PANEL_ID);
        for (const path of paths) {
          const problem = await panel.model.attachFile(path);
          if (problem) {
            Notification.error(`Kaizen could not attach ${path}: ${problem}`, {
              autoClose: 8000
            });
            return;
          }
        }
      }
    });
    app.contextMenu.addItem({
      command: CommandIDs.attachFile,
      selector: '.jp-DirListing-item[data-isdir="false"]',
      rank: 60
    });

    // "Add to Kaizen documents" on files of the file browser (every selected file): the
    // server reads each through its ContentsManager into the member's documents; adding a
    // file again makes its next version.
    app.commands.addCommand(CommandIDs.addToDocuments, {
      label: 'Add to Kaizen Documents',
      caption: 'Add this file to your Kaizen documents, for search with citations',
      icon: kaizenIcon,
      isVisible: () => selectedFiles(browser).length > 0,
      execute: async args => {
        const paths = typeof args.path === 'string' ? [args.path] : selectedFiles(browser);
        await addToDocuments(api, paths, documentsList);
      }
    });
    app.contextMenu.addItem({
      command: CommandIDs.addToDocuments,
      selector: '.jp-DirListing-item[data-isdir="false"]',
      rank: 61
    });

    // The current notebook, saved first: the server reads the file, so what Kaizen indexes
    // is what the member sees.
    if (tracker) {
      app.commands.addCommand(CommandIDs.addNotebookToDocuments, {
        label: args => (args.isToolbar ? '' : 'Add This Notebook to Kaizen Documents'),
        caption: 'Add this notebook to your Kaizen documents (saved first)',
        icon: args => (args.isPalette ? undefined : kaizenIcon),
        isEnabled: () => !!tracker.currentWidget,
        execute: async () => {
          const current = tracker.currentWidget;
          if (!current) {
            return;
          }
          await current.context.ready;
          if (current.context.model.dirty) {
            await current.context.save();
          }
          await addToDocuments(api, [current.context.path], documentsList);
        }
      });
      palette?.addItem({
        command: CommandIDs.addNotebookToDocuments,
        category: 'Kaizen',
        args: { isPalette: true }
      });
      app.contextMenu.addItem({
        command: CommandIDs.addNotebookToDocuments,
        selector: '.jp-Notebook',
        rank: 21
      });
    }

    app.commands.addCommand(CommandIDs.openDocuments, {
      label: 'Open Kaizen Documents',
      caption: 'The documents Kaizen can search for you: open or remove them',
      execute: () => {
        if (!documentsList || documentsList.isDisposed) {
          documentsList = new DocumentsList({
            api,
            open: openCitation,
            confirmRemove,
            me: () => panel.model.getSnapshot().me?.member ?? null
          });
          app.shell.add(documentsList, 'main');
        } else {
          void documentsList.refresh();
        }
        app.shell.activateById(documentsList.id);
      }
    });
    palette?.addItem({ command: CommandIDs.openDocuments, category: 'Kaizen' });

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
