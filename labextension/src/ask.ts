/**
 * "Ask Kaizen about this cell / selection": the message sent for a notebook cell, with a
 * reference to the notebook (path) and the cell (index and id), and the selected text (or
 * the whole cell source) in a fenced block.
 *
 * Pure module: no JupyterLab import, unit-tested under plain Node.
 */

export interface ICellContext {
  /** The notebook's path, relative to the server root. */
  path: string;
  /** 0-based index of the cell in the notebook. */
  index: number;
  /** The nbformat cell id (may be empty for old notebooks). */
  id: string;
  /** `code`, `markdown` or `raw`. */
  cellType: string;
  /** The kernel language for code cells (`python`, …); empty when unknown. */
  language: string;
  source: string;
  /** Character offsets of the editor selection; absent or empty: the whole cell. */
  selection?: { start: number; end: number } | null;
}

/** The most text of a cell sent with a question (characters); the rest is cut, with a marker. */
export const MAX_CONTEXT_CHARS = 20000;

export const DEFAULT_QUESTION = 'Explain this code.';

/** 1-based first and last line of `[start, end)` in `source`. */
export function selectionLines(source: string, start: number, end: number): { from: number; to: number } {
  const lo = Math.max(0, Math.min(start, end, source.length));
  const hi = Math.max(0, Math.min(Math.max(start, end), source.length));
  const from = source.slice(0, lo).split('\n').length;
  // A selection ending at the start of a line does not include that line.
  const upTo = hi > lo && source[hi - 1] === '\n' ? hi - 1 : hi;
  const to = source.slice(0, upTo).split('\n').length;
  return { from, to: Math.max(from, to) };
}

/** A Markdown code fence longer than any backtick run inside `code`. */
export function fenceFor(code: string): string {
  let longest = 0;
  for (const run of code.match(/`+/g) ?? []) {
    longest = Math.max(longest, run.length);
  }
  return '`'.repeat(Math.max(3, longest + 1));
}

/** What is quoted: the selection when there is one, else the whole cell. */
export function quotedPart(context: ICellContext): {
  text: string;
  selected: boolean;
  lines: { from: number; to: number } | null;
} {
  const sel = context.selection;
  if (sel && sel.start !== sel.end) {
    const start = Math.min(sel.start, sel.end);
    const end = Math.max(sel.start, sel.end);
    const text = context.source.slice(start, end);
    if (text.trim()) {
      return { text, selected: true, lines: selectionLines(context.source, start, end) };
    }
  }
  return { text: context.source, selected: false, lines: null };
}

/** The short reference line: notebook, cell index and id, lines of a selection. */
export function cellReference(context: ICellContext): string {
  const part = quotedPart(context);
  const id = context.id ? `, id \`${context.id}\`` : '';
  const kind = context.cellType && context.cellType !== 'code' ? ` (${context.cellType})` : '';
  const where = part.lines
    ? part.lines.from === part.lines.to
      ? `, selection on line ${part.lines.from}`
      : `, selection of lines ${part.lines.from}–${part.lines.to}`
    : '';
  return `notebook \`${context.path}\`, cell ${context.index}${kind}${id}${where}`;
}

/** The whole message: the question, then the reference, then the quoted code. */
export function askMessage(
  question: string,
  context: ICellContext,
  limit = MAX_CONTEXT_CHARS
): string {
  const part = quotedPart(context);
  let code = part.text.replace(/\s+$/, '');
  let cut = '';
  if (code.length > limit) {
    cut = `\n(${code.length - limit} more characters of the cell were not sent.)`;
    code = code.slice(0, limit);
  }
  const fence = fenceFor(code);
  const language = context.cellType === 'markdown' ? 'markdown' : context.cellType === 'code' ? context.language : '';
  const ask = question.trim() || DEFAULT_QUESTION;
  return (
    `${ask}\n\n` +
    `From ${cellReference(context)}:\n\n` +
    `${fence}${language}\n${code}\n${fence}${cut}`
  );
}

/** A short title for a conversation started from a cell. */
export function askTitle(context: ICellContext): string {
  const name = context.path.split('/').pop() || context.path || 'notebook';
  return `About ${name}, cell ${context.index}`;
}
