/**
 * What the panel needs from JupyterLab itself, handed down from the plugin (index.ts) through
 * React context so components stay testable without a JupyterLab application.
 */
import React from 'react';

export interface IJupyterHost {
  /** The folder "Save next to the notebook" proposes: the current notebook's, else the file
   * browser's, else the root (''). */
  currentFolder(): string;
}

export const JupyterHostContext = React.createContext<IJupyterHost>({ currentFolder: () => '' });
