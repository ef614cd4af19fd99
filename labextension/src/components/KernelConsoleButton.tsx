/**
 * "Open kernel console": opens the member's own persistent run_code kernel of this
 * conversation in a JupyterLab console. Disabled (with the reason as its tooltip) when the
 * server says there is no such kernel, or consoles are turned off.
 */
import React, { useSyncExternalStore } from 'react';

import { ConsoleLauncher, consoleButton, KernelConsoleModel } from '../kernelConsole';

export function KernelConsoleButton({
  model,
  launch
}: {
  model: KernelConsoleModel;
  launch: ConsoleLauncher;
}): JSX.Element {
  const state = useSyncExternalStore(model.subscribe, model.getSnapshot);
  const { enabled, title } = consoleButton(state);
  return (
    <span className="jp-Kaizen-kernelConsole" data-phase={state.phase}>
      <button
        type="button"
        className="jp-Kaizen-linkButton jp-Kaizen-openConsole"
        disabled={!enabled}
        aria-disabled={!enabled}
        title={title}
        onClick={() => void model.open(launch)}
        onFocus={() => {
          if (state.phase === 'unknown') {
            void model.refresh();
          }
        }}
      >
        {state.opening ? 'Opening console…' : 'Open kernel console'}
      </button>
      {state.message && (
        <span className="jp-Kaizen-consoleMessage" role="alert">
          {state.message}
          <button
            type="button"
            className="jp-Kaizen-iconButton"
            aria-label="Dismiss"
            onClick={() => model.dismiss()}
          >
            ×
          </button>
        </span>
      )}
    </span>
  );
}
