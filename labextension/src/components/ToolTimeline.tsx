/**
 * The tool activity of one run: one row per call with name, capability, duration and an
 * outcome badge; a running call shows a spinner and its elapsed time. Arguments and result
 * expand (`<details>`: keyboard operable by itself) and are bounded. What a call showed on the
 * chat canvas stays visible under its row.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React from 'react';

import { boundedText, durationMs, formatDuration, IToolCallView } from '../journal';
import { ChatCanvas } from './ChatCanvas';
import { Elapsed, Spinner } from './Elapsed';

const OUTCOME_LABELS: Record<string, string> = {
  ok: 'ok',
  error: 'error',
  raised: 'failed',
  timeout: 'timed out',
  abandoned: 'abandoned',
  suppressed: 'suppressed'
};

export function ToolTimeline({
  tools,
  running,
  rendermime
}: {
  tools: IToolCallView[];
  running: boolean;
  rendermime: IRenderMimeRegistry;
}): JSX.Element | null {
  if (!tools.length) {
    return null;
  }
  return (
    <ol className="jp-Kaizen-tools" aria-label="Tool calls">
      {tools.map(call => (
        <ToolCall key={call.callId} call={call} running={running} rendermime={rendermime} />
      ))}
    </ol>
  );
}

function ToolCall({
  call,
  running,
  rendermime
}: {
  call: IToolCallView;
  running: boolean;
  rendermime: IRenderMimeRegistry;
}): JSX.Element {
  const settled = call.outcome !== undefined;
  const duration = settled ? durationMs(call.requestedAt, call.settledAt) : null;
  const args = boundedText(call.arguments, 2000);
  const result = boundedText(call.content, 4000);
  const outcome = call.outcome ?? '';
  return (
    <li className="jp-Kaizen-tool" data-outcome={settled ? outcome : 'running'} data-tool={call.name}>
      <details>
        <summary>
          <span className="jp-Kaizen-toolName">{call.name}</span>
          {call.capability && (
            <span className="jp-Kaizen-badge jp-Kaizen-capability" title="Capability">
              {call.capability}
            </span>
          )}
          <span className="jp-Kaizen-toolMeta">
            {settled ? (
              <>
                <span
                  className={`jp-Kaizen-badge jp-Kaizen-outcome jp-Kaizen-outcome-${outcome}`}
                  title={`Outcome: ${outcome}`}
                >
                  {OUTCOME_LABELS[outcome] ?? outcome}
                </span>
                {duration !== null && (
                  <span className="jp-Kaizen-duration">{formatDuration(duration)}</span>
                )}
              </>
            ) : running ? (
              <span className="jp-Kaizen-running">
                <Spinner />
                <span className="jp-Kaizen-srOnly">running for </span>
                <Elapsed since={call.requestedAt} />
              </span>
            ) : (
              <span className="jp-Kaizen-badge jp-Kaizen-outcome">no result</span>
            )}
          </span>
        </summary>
        <div className="jp-Kaizen-toolDetail">
          {args.text ? (
            <>
              <div className="jp-Kaizen-detailLabel">Arguments</div>
              <pre className="jp-Kaizen-pre">{args.text}</pre>
            </>
          ) : null}
          <div className="jp-Kaizen-detailLabel">Result</div>
          {settled ? (
            result.text ? (
              <pre className="jp-Kaizen-pre">{result.text}</pre>
            ) : (
              <p className="jp-Kaizen-muted">No content.</p>
            )
          ) : (
            <p className="jp-Kaizen-muted">Waiting for the result…</p>
          )}
        </div>
      </details>
      <ChatCanvas call={call} rendermime={rendermime} />
    </li>
  );
}
