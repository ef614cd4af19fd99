/** What the notebook components need from the panel: the API and the notebook editor. */
import React from 'react';

import { KaizenApi } from '../api';
import { INotebookEditor } from './editor';

export interface INotebookTools {
  api: KaizenApi | null;
  /** Applies accepted cells to open notebooks; null outside JupyterLab (cards read-only). */
  editor: INotebookEditor | null;
}

export const NotebookToolsContext = React.createContext<INotebookTools>({ api: null, editor: null });
