/**
 * "Ask Kaizen about this notebook" (command palette and the notebook toolbar): the question
 * is sent with the notebook attached. A notebook with unsaved changes is saved first, since
 * the server reads the file: what Kaizen reads is what the member sees.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, InputDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { CommandToolbarButton, LabIcon } from '@jupyterlab/ui-components';

import { PanelModel } from '../model';

export const ASK_ABOUT_NOTEBOOK = 'kaizen:ask-about-notebook';
export const DEFAULT_NOTEBOOK_QUESTION = 'Explain this notebook.';

export function notebookMessage(question: string, path: string): string {
  const ask = question.trim() || DEFAULT_NOTEBOOK_QUESTION;
  return `${ask}\n\n(About the attached notebook \`${path}\`.)`;
}

export function registerNotebookCommands(options: {
  app: JupyterFrontEnd;
  tracker: INotebookTracker;
  model: PanelModel;
  icon: LabIcon;
  panelId: string;
  palette: ICommandPalette | null;
}): void {
  const { app, tracker, model, icon, panelId, palette } = options;
  app.commands.addCommand(ASK_ABOUT_NOTEBOOK, {
    label: args => (args.isToolbar ? '' : 'Ask Kaizen About This Notebook'),
    caption: 'Ask Kaizen about this notebook (it is attached to your message)',
    icon: args => (args.isPalette ? undefined : icon),
    isEnabled: () => !!tracker.currentWidget,
    execute: async args => {
      const panel = tracker.currentWidget;
      if (!panel) {
        return;
      }
      let question = typeof args.question === 'string' ? args.question : null;
      if (question === null) {
        const answer = await InputDialog.getText({
          title: 'Ask Kaizen about this notebook',
          label: `About ${panel.context.path}`,
          placeholder: `Your question (empty: ${DEFAULT_NOTEBOOK_QUESTION.toLowerCase()})`,
          okLabel: 'Ask'
        });
        if (!answer.button.accept) {
          return;
        }
        question = answer.value ?? '';
      }
      await panel.context.ready;
      if (panel.context.model.dirty) {
        await panel.context.save();
      }
      const path = panel.context.path;
      app.shell.activateById(panelId);
      const name = path.split('/').pop() || path;
      await model.ask(notebookMessage(question, path), `About ${name}`, path);
    }
  });
  palette?.addItem({ command: ASK_ABOUT_NOTEBOOK, category: 'Kaizen', args: { isPalette: true } });
  tracker.widgetAdded.connect((_sender, panel) => {
    panel.toolbar.insertItem(
      10,
      'kaizen-ask-notebook',
      new CommandToolbarButton({
        commands: app.commands,
        id: ASK_ABOUT_NOTEBOOK,
        args: { isToolbar: true }
      })
    );
  });
}
