/**
 * Applying an accepted proposed cell to the notebook *as it is open in JupyterLab*: through
 * the notebook's shared model, so unsaved changes are the base, collaborators see the edit
 * as any other, and JupyterLab's own undo (Ctrl+Z in the notebook) covers it too. Each
 * apply hands back an `undo` that reverses exactly that change while the cell is as it left
 * it. Nothing runs unless the member accepted "run after insert".
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import { applicability, ILiveCell, IProposedCellView } from './edits';

export interface IApplied {
  outcome: 'applied' | 'stale' | 'failed';
  detail: string;
  /** Reverses the change; resolves to null, or a sentence saying why it could not. */
  undo?: () => Promise<string | null>;
}

export interface INotebookEditor {
  apply(path: string, cell: IProposedCellView, runAfter: boolean): Promise<IApplied>;
}

interface ISharedCell {
  id: string;
  getSource(): string;
  setSource(source: string): void;
  toJSON(): Record<string, unknown>;
}

interface ISharedNotebook {
  cells: ISharedCell[];
  insertCell(index: number, cell: Record<string, unknown>): unknown;
  deleteCell(index: number): void;
  transact(f: () => void): void;
}

export class JupyterNotebookEditor implements INotebookEditor {
  constructor(
    private readonly _app: JupyterFrontEnd,
    private readonly _tracker: INotebookTracker
  ) {}

  /** The open notebook at `path`, opened when it is not. */
  async panel(path: string): Promise<NotebookPanel | null> {
    let panel = this._tracker.find(w => w.context.path === path) ?? null;
    if (!panel && this._app.commands.hasCommand('docmanager:open')) {
      const opened = await this._app.commands.execute('docmanager:open', { path });
      panel = opened instanceof NotebookPanel ? opened : null;
    }
    if (panel) {
      await panel.context.ready;
    }
    return panel;
  }

  async apply(path: string, cell: IProposedCellView, runAfter: boolean): Promise<IApplied> {
    const panel = await this.panel(path);
    const shared = panel?.content.model?.sharedModel as unknown as ISharedNotebook | undefined;
    if (!panel || !shared) {
      return { outcome: 'failed', detail: 'The notebook could not be opened.' };
    }
    const live = (): ILiveCell[] => shared.cells.map(c => ({ id: c.id, source: c.getSource() }));
    const check = applicability(cell, live());
    if (!check.ok) {
      return { outcome: 'stale', detail: check.reason };
    }
    const at = check.index;
    const find = (): number => shared.cells.findIndex(c => c.id === cell.cellId);
    try {
      if (cell.op === 'replace') {
        const before = shared.cells[at].toJSON();
        const next = cell.source ?? '';
        if (before.cell_type === cell.cellType) {
          shared.cells[at].setSource(next);
        } else {
          shared.transact(() => {
            shared.deleteCell(at);
            shared.insertCell(at, { ...freshCell(cell.cellType, next), id: cell.cellId });
          });
        }
        return {
          outcome: 'applied',
          detail: '',
          undo: async () => {
            const index = find();
            if (index < 0 || shared.cells[index].getSource() !== next) {
              return 'The cell was changed after the edit; undo it in the notebook instead.';
            }
            shared.transact(() => {
              shared.deleteCell(index);
              shared.insertCell(index, before);
            });
            return null;
          }
        };
      }
      if (cell.op === 'delete') {
        const before = shared.cells[at].toJSON();
        shared.deleteCell(at);
        return {
          outcome: 'applied',
          detail: '',
          undo: async () => {
            if (find() >= 0) {
              return 'The cell is back already.';
            }
            shared.insertCell(Math.min(at, shared.cells.length), before);
            return null;
          }
        };
      }
      const source = cell.source ?? '';
      shared.insertCell(at, { ...freshCell(cell.cellType, source), id: cell.cellId });
      if (runAfter && cell.cellType === 'code') {
        const notebook = panel.content;
        notebook.activeCellIndex = at;
        notebook.deselectAll();
        await NotebookActions.run(notebook, panel.sessionContext);
      }
      return {
        outcome: 'applied',
        detail: runAfter ? 'ran after insert' : '',
        undo: async () => {
          const index = find();
          if (index < 0) {
            return 'The inserted cell is gone already.';
          }
          if (shared.cells[index].getSource() !== source) {
            return 'The inserted cell was changed; delete it in the notebook instead.';
          }
          shared.deleteCell(index);
          return null;
        }
      };
    } catch (reason) {
      console.warn('Kaizen: applying a notebook edit failed', reason);
      return { outcome: 'failed', detail: 'JupyterLab could not apply the edit.' };
    }
  }
}

function freshCell(cellType: string, source: string): Record<string, unknown> {
  return cellType === 'code'
    ? { cell_type: 'code', source, metadata: {}, outputs: [], execution_count: null }
    : { cell_type: cellType, source, metadata: {} };
}
