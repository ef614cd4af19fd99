/** The notebook routes of the Kaizen REST API (docs/notebook.md), over `KaizenApi`. */
import { KaizenApi, Result } from '../api';
import { isRecord } from '../protocol';

export interface IAttachedNotebook {
  artifact_id: string;
  version: number;
  path: string;
  cells: number;
}

function attached(body: unknown): IAttachedNotebook | null {
  return isRecord(body) && typeof body.artifact_id === 'string' && typeof body.path === 'string'
    ? {
        artifact_id: body.artifact_id,
        version: Number(body.version),
        path: body.path,
        cells: Number(body.cells)
      }
    : null;
}

const conv = (id: string): string => `conversations/${encodeURIComponent(id)}`;
const cell = (proposal: string, ordinal: number): string =>
  `notebook-edits/${encodeURIComponent(proposal)}/cells/${ordinal}`;
const ok = (body: unknown): unknown => (isRecord(body) ? body : null);

export function attachNotebook(api: KaizenApi, conversationId: string, path: string): Promise<Result<IAttachedNotebook>> {
  return api.call('POST', `${conv(conversationId)}/notebooks`, { path }, 'attach the notebook', attached);
}

export function kernelAccess(
  api: KaizenApi,
  conversationId: string,
  method: 'GET' | 'PUT' | 'DELETE'
): Promise<Result<boolean>> {
  return api.call(
    method,
    `${conv(conversationId)}/notebook-kernel-access`,
    undefined,
    'change kernel access',
    body => (isRecord(body) && typeof body.allowed === 'boolean' ? body.allowed : null)
  );
}

export function decideCell(
  api: KaizenApi,
  proposalId: string,
  ordinal: number,
  accept: boolean,
  runAfter: boolean
): Promise<Result<unknown>> {
  return api.call(
    'POST',
    `${cell(proposalId, ordinal)}/decision`,
    { decision: accept ? 'accept' : 'reject', run_after: runAfter },
    'record your decision',
    ok
  );
}

export function recordResult(
  api: KaizenApi,
  proposalId: string,
  ordinal: number,
  outcome: string,
  detail: string
): Promise<Result<unknown>> {
  return api.call(
    'POST',
    `${cell(proposalId, ordinal)}/result`,
    { outcome, detail: detail.slice(0, 300) },
    'record the result',
    ok
  );
}
