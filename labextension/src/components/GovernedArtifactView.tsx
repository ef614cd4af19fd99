/**
 * A governed renderable artifact, natively: its markings key by key,
 * provenance, a native table (text nodes only) for the reviewed `table` renderer, otherwise
 * the producer's text fallback as inert text. A `result_ref` is labelled and never resolved
 * or fetched. No frame, no HTML: producer data never becomes markup.
 */
import React from 'react';

import { IArtifactView, MAX_TABLE_ROWS, readGovernedEnvelope } from '../artifacts';

export function GovernedArtifactView({ artifact }: { artifact: IArtifactView }): JSX.Element {
  const envelope = readGovernedEnvelope(artifact.content);
  if (!envelope) {
    return (
      <p className="jp-Kaizen-status" data-governed="unreadable">
        This governed result cannot be shown here. Download it to read its JSON.
      </p>
    );
  }
  return (
    <div className="jp-Kaizen-governed" data-governed={envelope.table ? 'table' : 'text'}>
      {envelope.markings.length > 0 && (
        <dl className="jp-Kaizen-markings" aria-label="Security markings">
          {envelope.markings.map(([key, value]) => (
            <div key={key} className="jp-Kaizen-marking">
              <dt>{key}</dt>
              <dd>{value}</dd>
            </div>
          ))}
        </dl>
      )}
      {envelope.provenance.length > 0 && (
        <p className="jp-Kaizen-provenance">
          Provenance: {envelope.provenance.map(([key, value]) => `${key} ${value}`).join(' · ')}
        </p>
      )}
      {envelope.resultRef && (
        <p className="jp-Kaizen-resultRef">
          Referenced result (not fetched): <code>{envelope.resultRef.id}</code>
        </p>
      )}
      {envelope.table ? (
        <div className="jp-Kaizen-tableScroll">
          <table className="jp-Kaizen-governedTable">
            <caption>{envelope.title || artifact.title}</caption>
            <thead>
              <tr>
                {envelope.table.columns.map((column, i) => (
                  <th key={i} scope="col">
                    {column}
                  </th>
                ))}
              </tr>
            </thead>
            <tbody>
              {envelope.table.rows.map((row, r) => (
                <tr key={r}>
                  {row.map((cell, c) => (
                    <td key={c}>{cell}</td>
                  ))}
                </tr>
              ))}
            </tbody>
          </table>
          {envelope.table.omitted > 0 && (
            <p className="jp-Kaizen-status">
              {envelope.table.omitted} more rows (the first {MAX_TABLE_ROWS} are shown): download
              the JSON for all of them.
            </p>
          )}
        </div>
      ) : (
        <pre className="jp-Kaizen-artifactText jp-Kaizen-textFallback">{envelope.textFallback}</pre>
      )}
    </div>
  );
}
