/**
 * A `propose_notebook_edit` proposal: one row per cell with its diff, Accept / Reject for
 * the member it belongs to (and "run after insert" for an inserted code cell), then what
 * happened: applied (with Undo), stale, failed, undone. Decisions and outcomes come back
 * through the journal, so every viewer sees the same state; the undo itself is this tab's.
 */
import React, { useContext, useState } from 'react';

import { decideCell, recordResult } from '../notebook/api';
import { NotebookToolsContext } from '../notebook/context';
import { IProposalView, IProposedCellView, lineDiff } from '../notebook/edits';

export interface INotebookProposalProps {
  proposal: IProposalView;
  me: string | null;
}

function title(cell: IProposedCellView): string {
  if (cell.op === 'insert') {
    return cell.afterCellId
      ? `Insert a ${cell.cellType} cell after ${cell.afterCellId}`
      : `Insert a ${cell.cellType} cell at the top`;
  }
  return `${cell.op === 'replace' ? 'Replace' : 'Delete'} cell ${cell.cellId}`;
}

const OUTCOME_TEXT: Record<string, string> = {
  applied: 'Applied to the notebook.',
  stale: 'Not applied: the notebook changed.',
  failed: 'Not applied.',
  undone: 'Undone.'
};

export function NotebookProposalCard({ proposal, me }: INotebookProposalProps): JSX.Element {
  const headingId = `kaizen-proposal-${proposal.id}`;
  const mine = me !== null && me === proposal.member;
  return (
    <section className="jp-Kaizen-proposal" aria-labelledby={headingId} data-proposal-id={proposal.id}>
      <div className="jp-Kaizen-approvalHead">
        <span id={headingId} className="jp-Kaizen-approvalTitle">
          Proposed edit of <code>{proposal.path}</code>
        </span>
        <span className="jp-Kaizen-badge">{proposal.cells.length} cells</span>
      </div>
      {proposal.summary && <p className="jp-Kaizen-muted">{proposal.summary}</p>}
      <ol className="jp-Kaizen-proposalCells">
        {proposal.cells.map(cell => (
          <ProposedCell key={cell.ordinal} proposal={proposal} cell={cell} canDecide={mine} />
        ))}
      </ol>
      {!mine && <p className="jp-Kaizen-muted">Only {proposal.member} can accept these changes.</p>}
    </section>
  );
}

function ProposedCell({
  proposal,
  cell,
  canDecide
}: {
  proposal: IProposalView;
  cell: IProposedCellView;
  canDecide: boolean;
}): JSX.Element {
  const { api, editor } = useContext(NotebookToolsContext);
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState<string | null>(null);
  const [runAfter, setRunAfter] = useState(false);
  const [undo, setUndo] = useState<(() => Promise<string | null>) | null>(null);
  const diff = lineDiff(cell.baseSource ?? '', cell.op === 'delete' ? '' : (cell.source ?? ''));
  const canRun = cell.op === 'insert' && cell.cellType === 'code';

  const accept = async (): Promise<void> => {
    if (!api || !editor) {
      return;
    }
    setBusy(true);
    setMessage(null);
    try {
      const decided = await decideCell(api, proposal.id, cell.ordinal, true, canRun && runAfter);
      if (!decided.ok) {
        setMessage(decided.message);
        return;
      }
      const applied = await editor.apply(proposal.path, cell, canRun && runAfter);
      const recorded = await recordResult(api, proposal.id, cell.ordinal, applied.outcome, applied.detail);
      if (applied.outcome !== 'applied') {
        setMessage(applied.detail);
      } else if (!recorded.ok) {
        setMessage(recorded.message);
      }
      if (applied.undo) {
        setUndo(() => applied.undo ?? null);
      }
    } finally {
      setBusy(false);
    }
  };

  const reject = async (): Promise<void> => {
    if (!api) {
      return;
    }
    setBusy(true);
    const decided = await decideCell(api, proposal.id, cell.ordinal, false, false);
    setMessage(decided.ok ? null : decided.message);
    setBusy(false);
  };

  const undoNow = async (): Promise<void> => {
    if (!api || !undo) {
      return;
    }
    setBusy(true);
    const refused = await undo();
    if (refused) {
      setMessage(refused);
    } else {
      setUndo(null);
      const recorded = await recordResult(api, proposal.id, cell.ordinal, 'undone', '');
      setMessage(recorded.ok ? null : recorded.message);
    }
    setBusy(false);
  };

  const state = cell.outcome ?? cell.decision;
  return (
    <li className="jp-Kaizen-proposedCell" data-ordinal={cell.ordinal} data-state={state}>
      <div className="jp-Kaizen-proposedHead">
        <span className="jp-Kaizen-badge" data-op={cell.op}>
          {cell.op}
        </span>
        <span>{title(cell)}</span>
      </div>
      <pre className="jp-Kaizen-diff" aria-label={`Changes to ${title(cell)}`}>
        {diff.map((line, i) => (
          <div key={i} className={`jp-Kaizen-diffLine jp-Kaizen-diff-${line.kind}`}>
            {line.kind === 'added' ? '+ ' : line.kind === 'removed' ? '- ' : '  '}
            {line.text}
          </div>
        ))}
      </pre>
      {cell.decision === 'pending' && canDecide && editor ? (
        <div className="jp-Kaizen-actions">
          {canRun && (
            <label className="jp-Kaizen-runAfter">
              <input
                type="checkbox"
                checked={runAfter}
                disabled={busy}
                onChange={event => setRunAfter(event.target.checked)}
              />{' '}
              Run after insert
            </label>
          )}
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-accept jp-Kaizen-acceptCell"
            disabled={busy}
            onClick={() => void accept()}
          >
            Accept
          </button>
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-reject jp-Kaizen-rejectCell"
            disabled={busy}
            onClick={() => void reject()}
          >
            Reject
          </button>
        </div>
      ) : (
        <p className="jp-Kaizen-decision" data-decision={cell.decision}>
          {cell.decision === 'pending'
            ? 'Waiting for a decision.'
            : cell.decision === 'rejected'
              ? 'Rejected.'
              : cell.outcome
                ? OUTCOME_TEXT[cell.outcome] + (cell.detail && cell.outcome !== 'applied' ? ` ${cell.detail}` : '')
                : 'Accepted.'}
          {cell.outcome === 'applied' && undo && (
            <button
              type="button"
              className="jp-Kaizen-linkButton jp-Kaizen-undoCell"
              disabled={busy}
              onClick={() => void undoNow()}
            >
              Undo
            </button>
          )}
        </p>
      )}
      {message && (
        <p className="jp-Kaizen-error" role="alert">
          {message}
        </p>
      )}
    </li>
  );
}
