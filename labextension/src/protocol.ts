/**
 * The wire shapes of the Kaizen journal (shared API.md): durable events, as served by
 * `GET conversations/{id}/journal` and the events websocket (`live: false`), and live-only
 * frames (`answer.delta`, `thinking.delta`, `live: true`, no `seq`).
 *
 * Pure module: no JupyterLab import, so the reducer and its tests run under plain Node.
 */

export type Data = Record<string, unknown>;

/** A durable journal event. */
export interface IJournalEvent {
  seq: number;
  conversation_id: string;
  run_id: string | null;
  type: string;
  actor: string;
  at: string;
  data: Data;
  live: false;
}

/** A live-only frame: shown now, never stored, never replayed. */
export interface ILiveFrame {
  live: true;
  type: string;
  conversation_id: string;
  run_id: string | null;
  data: Data;
}

export type JournalEvent = IJournalEvent;
export type Frame = IJournalEvent | ILiveFrame;

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The flag of event data the server journaled escaped: text the databases cannot store
 * (U+0000, unpaired surrogates) had a backslash written as two and each such code unit as
 * backslash-u and four hex digits, in every string (keys too); docs/architecture.md, "Text
 * the databases cannot store". */
export const ESCAPED_FLAG = 'text_escaped';

function unescapeText(text: string): string {
  return text.replace(/\\(\\|u[0-9a-f]{4})/g, (_match, token: string) =>
    token === '\\' ? '\\' : String.fromCharCode(parseInt(token.slice(1), 16))
  );
}

function unescapeValue(value: unknown): unknown {
  if (typeof value === 'string') {
    return unescapeText(value);
  }
  if (Array.isArray(value)) {
    return value.map(unescapeValue);
  }
  if (isRecord(value)) {
    const out: Data = {};
    for (const [key, item] of Object.entries(value)) {
      out[unescapeText(key)] = unescapeValue(item);
    }
    return out;
  }
  return value;
}

/** Event data as it was before the server escaped it; the data itself when not flagged. */
export function restoreEscaped(data: Data): Data {
  if (data[ESCAPED_FLAG] !== true) {
    return data;
  }
  const rest: Data = { ...data };
  delete rest[ESCAPED_FLAG];
  return unescapeValue(rest) as Data;
}

/** Read a durable event out of a JSON value (REST page entry or socket frame). */
export function parseEvent(value: unknown): IJournalEvent | null {
  if (!isRecord(value) || typeof value.seq !== 'number' || typeof value.type !== 'string') {
    return null;
  }
  if (!Number.isInteger(value.seq) || value.seq < 1) {
    return null;
  }
  return {
    seq: value.seq,
    conversation_id: typeof value.conversation_id === 'string' ? value.conversation_id : '',
    run_id: typeof value.run_id === 'string' ? value.run_id : null,
    type: value.type,
    actor: typeof value.actor === 'string' ? value.actor : '',
    at: typeof value.at === 'string' ? value.at : '',
    data: isRecord(value.data) ? restoreEscaped(value.data) : {},
    live: false
  };
}

/** Read any socket frame: a durable event, a live frame, or null when unreadable. */
export function parseFrame(value: unknown): Frame | null {
  if (!isRecord(value)) {
    return null;
  }
  if (value.live === true) {
    if (typeof value.type !== 'string') {
      return null;
    }
    return {
      live: true,
      type: value.type,
      conversation_id: typeof value.conversation_id === 'string' ? value.conversation_id : '',
      run_id: typeof value.run_id === 'string' ? value.run_id : null,
      data: isRecord(value.data) ? value.data : {}
    };
  }
  return parseEvent(value);
}

export function str(data: Data, key: string, fallback = ''): string {
  const v = data[key];
  return typeof v === 'string' ? v : fallback;
}

export function num(data: Data, key: string, fallback = 0): number {
  const v = data[key];
  return typeof v === 'number' && Number.isFinite(v) ? v : fallback;
}
