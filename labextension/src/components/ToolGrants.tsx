/**
 * The tools the member allowed for the rest of this conversation ("Allow for this
 * conversation" on an approval card), each with a button that revokes it: the next call of
 * that tool asks again.
 */
import React, { useSyncExternalStore } from 'react';

import { GrantsModel } from '../grants';

export function ToolGrants({ model }: { model: GrantsModel }): JSX.Element | null {
  const { grants, message } = useSyncExternalStore(model.subscribe, model.getSnapshot);
  if (!grants.length && !message) {
    return null;
  }
  return (
    <div className="jp-Kaizen-grants" aria-label="Allowed in this conversation">
      {grants.length > 0 && <span className="jp-Kaizen-muted">Allowed here:</span>}
      {grants.map(g => (
        <span key={g.tool} className="jp-Kaizen-grant" data-tool={g.tool}>
          <code>{g.tool}</code>
          <button
            type="button"
            className="jp-Kaizen-iconButton"
            aria-label={`Stop allowing ${g.tool} in this conversation`}
            title={`Stop allowing ${g.tool}: its next call asks again`}
            onClick={() => void model.revoke(g.tool)}
          >
            ×
          </button>
        </span>
      ))}
      {message && (
        <span className="jp-Kaizen-error" role="alert">
          {message}
          <button type="button" className="jp-Kaizen-iconButton" aria-label="Dismiss"
                  onClick={() => model.dismiss()}>
            ×
          </button>
        </span>
      )}
    </div>
  );
}
