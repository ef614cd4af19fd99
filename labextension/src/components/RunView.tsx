/**
 * One run in the transcript: the member's input, the tool timeline, approval cards, the
 * answer (live while streaming, then committed in place) and how the run ended.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React from 'react';

import { IRunView, isTerminal } from '../journal';
import { ApprovalCard } from './ApprovalCard';
import { Spinner } from './Elapsed';
import { ICodeActions, Markdown } from './Markdown';
import { ToolTimeline } from './ToolTimeline';

export interface IRunProps {
  run: IRunView;
  me: string | null;
  rendermime: IRenderMimeRegistry;
  codeActions: ICodeActions;
  onCancel: (runId: string) => void;
  onDecide: (approvalId: string, decision: 'approve' | 'deny') => Promise<void>;
}

const TERMINAL_TEXT: Record<string, string> = {
  failed: 'The run failed.',
  answer_unavailable: 'No answer could be produced.',
  cancelled: 'Stopped.'
};

export function InputBubble({ run, me }: { run: IRunView; me: string | null }): JSX.Element | null {
  const input = run.input;
  if (!input) {
    return null;
  }
  const mine = me !== null && input.member === me;
  return (
    <div
      className={`jp-Kaizen-input${input.kind === 'steering' ? ' jp-Kaizen-input-steering' : ''}`}
      data-mine={mine ? 'true' : 'false'}
    >
      <div className="jp-Kaizen-author">
        {mine ? 'You' : input.member}
        {input.kind === 'steering' && <span className="jp-Kaizen-badge">steering</span>}
      </div>
      <div className="jp-Kaizen-inputText">{input.text}</div>
    </div>
  );
}

export function RunView(props: IRunProps): JSX.Element {
  const { run, me, rendermime, codeActions, onCancel, onDecide } = props;
  const ended = isTerminal(run);
  const running = !ended && run.admitted;
  const answers = [...run.answers].sort((a, b) => a.step - b.step);
  const canDecide = me !== null && (run.input?.member ?? me) === me;
  return (
    <article
      className="jp-Kaizen-run"
      data-run-id={run.runId}
      data-status={run.status}
      aria-busy={running ? 'true' : 'false'}
    >
      <InputBubble run={run} me={me} />
      <ToolTimeline tools={run.tools} running={running} />
      {run.approvals.map(approval => (
        <ApprovalCard
          key={approval.approvalId}
          approval={approval}
          canDecide={canDecide}
          owner={run.input?.member ?? ''}
          onDecide={onDecide}
        />
      ))}
      {answers.map(answer => (
        <div
          key={`answer-${answer.step}`}
          className="jp-Kaizen-answer"
          data-committed={answer.committed ? 'true' : 'false'}
        >
          <Markdown
            text={answer.text}
            rendermime={rendermime}
            streaming={!answer.committed}
            codeActions={codeActions}
          />
          {answer.committed && (answer.model || answer.usage?.total_tokens) ? (
            <div className="jp-Kaizen-answerMeta">
              {[answer.model, answer.usage?.total_tokens ? `${answer.usage.total_tokens} tokens` : '']
                .filter(Boolean)
                .join(' · ')}
            </div>
          ) : null}
        </div>
      ))}
      {running && (
        <div className="jp-Kaizen-runStatus">
          <Spinner />
          <span>{run.status === 'awaiting_approval' ? 'Waiting for approval…' : 'Working…'}</span>
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-warn jp-Kaizen-stop"
            onClick={() => onCancel(run.runId)}
            aria-label="Stop this run"
          >
            Stop
          </button>
        </div>
      )}
      {ended && run.terminal && run.terminal.status !== 'completed' && (
        <p className="jp-Kaizen-terminal" data-status={run.terminal.status}>
          {run.terminal.message || TERMINAL_TEXT[run.terminal.status] || 'The run ended.'}
        </p>
      )}
    </article>
  );
}
