/**
 * The notebook events of a conversation's journal, folded into view state: notebooks the
 * member attached, their kernel-access permission, and each `propose_notebook_edit`
 * proposal with every cell's decision and outcome (docs/notebook.md).
 *
 * Pure (no JupyterLab import): unit-tested under plain Node. `journal.ts` hands every
 * `notebook.*` event to `applyNotebookEvent`.
 */
import { Data, IJournalEvent, isRecord, num, str } from '../protocol';

export type CellOp = 'insert' | 'replace' | 'delete';
export type CellDecision = 'pending' | 'accepted' | 'rejected';
export type CellOutcome = 'applied' | 'stale' | 'failed' | 'undone';

export interface IProposedCellView {
  ordinal: number;
  op: CellOp;
  cellId: string;
  afterCellId: string | null;
  cellType: string;
  /** The cell's source in the version the model read (replace/delete). */
  baseSource: string | null;
  /** The proposed source (insert/replace). */
  source: string | null;
  decision: CellDecision;
  runAfter: boolean;
  outcome: CellOutcome | null;
  detail?: string;
}

export interface IProposalView {
  id: string;
  runId: string;
  member: string;
  path: string;
  summary: string;
  seq: number;
  cells: IProposedCellView[];
}

export interface INotebookState {
  proposals: Readonly<Record<string, IProposalView>>;
  /** Proposal ids per run, in journal order. */
  byRun: Readonly<Record<string, readonly string[]>>;
  /** Notebook paths attached in this conversation, in order of first attachment. */
  attached: readonly string[];
  /** Members who allowed kernel access here now. */
  kernelAccess: readonly string[];
}

export const EMPTY_NOTEBOOK_STATE: INotebookState = {
  proposals: {},
  byRun: {},
  attached: [],
  kernelAccess: []
};

function parseCell(raw: unknown): IProposedCellView | null {
  if (!isRecord(raw)) {
    return null;
  }
  const op = str(raw, 'op');
  if (op !== 'insert' && op !== 'replace' && op !== 'delete') {
    return null;
  }
  const nullable = (key: string): string | null => (typeof raw[key] === 'string' ? (raw[key] as string) : null);
  return {
    ordinal: num(raw, 'ordinal'),
    op,
    cellId: str(raw, 'cell_id'),
    afterCellId: nullable('after_cell_id'),
    cellType: str(raw, 'cell_type', 'code'),
    baseSource: nullable('base_source'),
    source: nullable('source'),
    decision: 'pending',
    runAfter: false,
    outcome: null
  };
}

function updateCell(
  state: INotebookState,
  d: Data,
  change: (cell: IProposedCellView) => IProposedCellView
): INotebookState {
  const proposal = state.proposals[str(d, 'proposal_id')];
  if (!proposal) {
    return state;
  }
  const ordinal = num(d, 'ordinal', -1);
  const cells = proposal.cells.map(c => (c.ordinal === ordinal ? change(c) : c));
  return { ...state, proposals: { ...state.proposals, [proposal.id]: { ...proposal, cells } } };
}

/** Fold one `notebook.*` journal event. Unknown shapes change nothing. */
export function applyNotebookEvent(state: INotebookState, event: IJournalEvent): INotebookState {
  const d = event.data;
  switch (event.type) {
    case 'notebook.attached': {
      const path = str(d, 'path');
      return path && !state.attached.includes(path)
        ? { ...state, attached: [...state.attached, path] }
        : state;
    }
    case 'notebook.kernel_access': {
      const member = str(d, 'member', event.actor);
      const others = state.kernelAccess.filter(m => m !== member);
      return { ...state, kernelAccess: d.allowed === true ? [...others, member] : others };
    }
    case 'notebook.edit.proposed': {
      const id = str(d, 'id');
      const runId = event.run_id ?? str(d, 'run_id');
      if (!id || state.proposals[id] || !Array.isArray(d.cells)) {
        return state;
      }
      const proposal: IProposalView = {
        id,
        runId,
        member: str(d, 'member', event.actor),
        path: str(d, 'path'),
        summary: str(d, 'summary'),
        seq: event.seq,
        cells: d.cells.map(parseCell).filter((c): c is IProposedCellView => c !== null)
      };
      return {
        ...state,
        proposals: { ...state.proposals, [id]: proposal },
        byRun: { ...state.byRun, [runId]: [...(state.byRun[runId] ?? []), id] }
      };
    }
    case 'notebook.edit.decided':
      return updateCell(state, d, cell => ({
        ...cell,
        decision: str(d, 'decision') === 'accepted' ? 'accepted' : 'rejected',
        runAfter: d.run_after === true
      }));
    case 'notebook.edit.result': {
      const outcome = str(d, 'outcome');
      if (!['applied', 'stale', 'failed', 'undone'].includes(outcome)) {
        return state;
      }
      return updateCell(state, d, cell => ({
        ...cell,
        outcome: outcome as CellOutcome,
        detail: str(d, 'detail') || undefined
      }));
    }
    default:
      return state;
  }
}

export type DiffLine = { kind: 'same' | 'removed' | 'added'; text: string };

/**
 * A line diff of `before` → `after` (longest common subsequence; cells are small, and the
 * table is bounded to 400×400 lines, past which it shows all removed then all added).
 */
export function lineDiff(before: string, after: string): DiffLine[] {
  const a = before === '' ? [] : before.split('\n');
  const b = after === '' ? [] : after.split('\n');
  if (a.length * b.length > 160000) {
    return [
      ...a.map(text => ({ kind: 'removed' as const, text })),
      ...b.map(text => ({ kind: 'added' as const, text }))
    ];
  }
  const lcs: number[][] = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out: DiffLine[] = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i] === b[j]) {
      out.push({ kind: 'same', text: a[i] });
      i++;
      j++;
    } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
      out.push({ kind: 'removed', text: a[i++] });
    } else {
      out.push({ kind: 'added', text: b[j++] });
    }
  }
  while (i < a.length) {
    out.push({ kind: 'removed', text: a[i++] });
  }
  while (j < b.length) {
    out.push({ kind: 'added', text: b[j++] });
  }
  return out;
}

/** The cells of a live notebook as the check needs them: id and source, in order. */
export interface ILiveCell {
  id: string;
  source: string;
}

export type Applicability = { ok: true; index: number } | { ok: false; reason: string };

/**
 * Whether a proposed cell still applies to the notebook as it is open now: the target (or
 * the insert's anchor) is there with the source the model read, and an inserted id is new.
 * Unsaved edits and collaborators' changes count: this is the live model, not the file.
 */
export function applicability(cell: IProposedCellView, live: readonly ILiveCell[]): Applicability {
  if (cell.op === 'insert') {
    if (live.some(c => c.id === cell.cellId)) {
      return { ok: false, reason: 'A cell with this id is already in the notebook.' };
    }
    if (cell.afterCellId === null) {
      return { ok: true, index: 0 };
    }
    const anchor = live.findIndex(c => c.id === cell.afterCellId);
    return anchor < 0
      ? { ok: false, reason: 'The cell it goes after is no longer in the notebook.' }
      : { ok: true, index: anchor + 1 };
  }
  const index = live.findIndex(c => c.id === cell.cellId);
  if (index < 0) {
    return { ok: false, reason: 'The cell is no longer in the notebook.' };
  }
  if (live[index].source !== cell.baseSource) {
    return { ok: false, reason: 'The cell changed since Kaizen read it.' };
  }
  return { ok: true, index };
}
