/**
 * Artifacts of a conversation (shared API.md `GET artifacts`, `GET artifacts/{id}`,
 * `…/versions/{n}`, `…/download`): the wire shapes, and how the pane may show each one.
 *
 * Pure module (no JupyterLab import): the decisions below are the security boundary of the
 * preview, so they are unit-tested under plain Node.
 *
 * - A governed renderable artifact (the reserved `code` + `renderable-artifact` pair, or
 *   flagged `governed` by the server) is shown only as native text: its markings, its
 *   `text_fallback`, and a native table for the reviewed `table` renderer. It never reaches a
 *   frame, and a `result_ref` is shown as a label, never resolved or fetched.
 * - Ordinary `html` and `svg` are previewed in a frame sandboxed without scripts; `markdown`
 *   through JupyterLab's sanitizing rendermime; live canvases (`react`, `mermaid`) as their
 *   source text, never executed; code, json and graphs as text; files as a download only.
 */
import { isRecord } from './protocol';

/** The reserved pair of governed renderable artifacts (store/models.py RESERVED_ARTIFACT_*). */
export const RESERVED_KIND = 'code';
export const RESERVED_LANGUAGE = 'renderable-artifact';
/** The mime the server gives a governed version. */
export const GOVERNED_MIME = 'application/vnd.kaizen.renderable+json';

/** One artifact of a listing (its latest visible version, no content). */
export interface IArtifact {
  id: string;
  owner: string;
  version: number;
  latestVersion: number;
  kind: string;
  language: string | null;
  title: string;
  mime: string;
  digest: string;
  size: number;
  author: string;
  conversationId: string | null;
  roomId: string | null;
  governed: boolean;
  createdAt: string;
}

/** One version with its content (text kinds only) and the version numbers the member sees. */
export interface IArtifactView extends IArtifact {
  /** The text of a text kind; null for a file (download only). */
  content: string | null;
  versions: number[];
}

export function parseArtifact(item: unknown): IArtifact | null {
  if (!isRecord(item) || typeof item.id !== 'string' || !item.id) {
    return null;
  }
  const int = (v: unknown): number => (typeof v === 'number' && Number.isInteger(v) ? v : 0);
  const text = (v: unknown): string => (typeof v === 'string' ? v : '');
  const version = int(item.version);
  if (version < 1) {
    return null;
  }
  return {
    id: item.id,
    owner: text(item.owner),
    version,
    latestVersion: Math.max(version, int(item.latest_version)),
    kind: text(item.kind) || 'file',
    language: typeof item.language === 'string' ? item.language : null,
    title: text(item.title) || 'Untitled artifact',
    mime: text(item.mime),
    digest: text(item.digest),
    size: int(item.size),
    author: text(item.author),
    conversationId: typeof item.conversation_id === 'string' ? item.conversation_id : null,
    roomId: typeof item.room_id === 'string' ? item.room_id : null,
    governed: item.governed === true,
    createdAt: text(item.created_at)
  };
}

export function parseArtifacts(body: unknown): IArtifact[] | null {
  if (!Array.isArray(body)) {
    return null;
  }
  return body.map(parseArtifact).filter((a): a is IArtifact => a !== null);
}

export function parseArtifactView(body: unknown): IArtifactView | null {
  const artifact = parseArtifact(body);
  if (!artifact || !isRecord(body)) {
    return null;
  }
  const versions = Array.isArray(body.versions)
    ? body.versions.filter((v): v is number => typeof v === 'number' && Number.isInteger(v) && v > 0)
    : [];
  return {
    ...artifact,
    content: typeof body.content === 'string' ? body.content : null,
    versions: versions.length ? versions : [artifact.version]
  };
}

/**
 * Whether an artifact takes the governed path. Any one sign is enough: the server's flag,
 * the reserved kind/language pair (even unattested), or the governed mime.
 */
export function isGovernedArtifact(
  artifact: Pick<IArtifact, 'governed' | 'kind' | 'language' | 'mime'>
): boolean {
  return (
    artifact.governed === true ||
    (artifact.kind === RESERVED_KIND && artifact.language === RESERVED_LANGUAGE) ||
    artifact.mime === GOVERNED_MIME
  );
}

/** How the pane shows a version. */
export type PreviewMode =
  /** Native text only: markings, text fallback, a native table (never a frame). */
  | 'governed'
  /** JupyterLab's rendermime, untrusted (sanitized). */
  | 'markdown'
  /** A frame sandboxed without scripts (`sandbox=""`), given its text inline (no URL). */
  | 'frame'
  /** A live canvas: its source as text, not executed. */
  | 'canvas-source'
  /** Plain text in a `<pre>`. */
  | 'text'
  /** No preview: the download only. */
  | 'download';

/** The kinds a sandboxed frame may show: ordinary documents, never governed data. */
export const FRAME_KINDS: ReadonlySet<string> = new Set(['html', 'svg']);
/** Live canvases: their code would run if rendered, so only their source is shown. */
export const CANVAS_KINDS: ReadonlySet<string> = new Set(['react', 'mermaid']);
const TEXT_KINDS: ReadonlySet<string> = new Set(['code', 'json', 'graph']);

export function previewMode(
  artifact: Pick<IArtifact, 'governed' | 'kind' | 'language' | 'mime'>
): PreviewMode {
  // The governed check comes first and wins over every kind below.
  if (isGovernedArtifact(artifact)) {
    return 'governed';
  }
  if (artifact.kind === 'markdown') {
    return 'markdown';
  }
  if (FRAME_KINDS.has(artifact.kind)) {
    return 'frame';
  }
  if (CANVAS_KINDS.has(artifact.kind)) {
    return 'canvas-source';
  }
  if (TEXT_KINDS.has(artifact.kind)) {
    return 'text';
  }
  return 'download';
}

/**
 * The inline document of a sandboxed preview frame: the artifact's own text, behind a policy that
 * lets it load nothing from the network (inline styles and data: images only). Scripts are
 * already off through `sandbox=""`; the policy also stops tracking pixels and remote fonts.
 */
export const FRAME_POLICY =
  "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:";

export function frameDocument(content: string): string {
  return (
    `<meta http-equiv="Content-Security-Policy" content="${FRAME_POLICY}">` +
    '<meta name="referrer" content="no-referrer">' +
    content
  );
}

// -- governed envelopes ------------------------------------------------------------------------

/** A cell of the native table: always text. */
export interface IGovernedTable {
  columns: string[];
  rows: string[][];
  /** Rows left out beyond the shown bound. */
  omitted: number;
}

export interface IGovernedView {
  title: string;
  renderer: string;
  textFallback: string;
  /** The structured markings, key by key, as the producer gave them (never flattened). */
  markings: Array<[string, string]>;
  provenance: Array<[string, string]>;
  /** The native table, when the renderer is the reviewed `table` and the result fits it. */
  table: IGovernedTable | null;
  /** An opaque result reference: labelled, never resolved or fetched. */
  resultRef: { id: string; sha256: string } | null;
}

export const MAX_TABLE_ROWS = 200;
const MAX_CELL_CHARS = 500;

/** The renderer names the panel renders natively; any other shows the text fallback. */
export const NATIVE_RENDERERS: ReadonlySet<string> = new Set(['table']);

/** Read a governed envelope (its canonical JSON) for native display, or null if unreadable. */
export function readGovernedEnvelope(content: string | null): IGovernedView | null {
  if (content === null) {
    return null;
  }
  let raw: unknown;
  try {
    raw = JSON.parse(content);
  } catch {
    return null;
  }
  if (!isRecord(raw)) {
    return null;
  }
  const text = (v: unknown): string => (typeof v === 'string' ? v : '');
  const entries = (v: unknown): Array<[string, string]> =>
    isRecord(v) ? Object.keys(v).map(k => [k, cellText(v[k])]) : [];
  const renderer = text(raw.renderer);
  const ref = raw.result_ref;
  const resultRef =
    isRecord(ref) && typeof ref.id === 'string' && typeof ref.sha256 === 'string'
      ? { id: ref.id, sha256: ref.sha256 }
      : null;
  return {
    title: text(raw.title),
    renderer,
    textFallback: text(raw.text_fallback),
    markings: entries(raw.markings),
    provenance: entries(raw.provenance),
    table: resultRef === null && NATIVE_RENDERERS.has(renderer) && 'result' in raw
      ? nativeTable(raw.result)
      : null,
    resultRef
  };
}

/**
 * A table result as text cells: `{columns: [...], rows: [[...], ...]}`, or a list of flat
 * records (the columns are their keys, in first-seen order). Anything else: null (the
 * text fallback shows instead).
 */
export function nativeTable(result: unknown): IGovernedTable | null {
  if (isRecord(result) && Array.isArray(result.columns) && Array.isArray(result.rows)) {
    const columns = result.columns.map(cellText);
    const rows = result.rows.filter(Array.isArray) as unknown[][];
    if (!columns.length || rows.length !== result.rows.length) {
      return null;
    }
    return bounded(columns, rows.map(row => columns.map((_, i) => cellText(row[i]))));
  }
  if (Array.isArray(result) && result.length && result.every(isRecord)) {
    const columns: string[] = [];
    for (const record of result as Array<Record<string, unknown>>) {
      for (const key of Object.keys(record)) {
        if (!columns.includes(key)) {
          columns.push(key);
        }
      }
    }
    return bounded(
      columns,
      (result as Array<Record<string, unknown>>).map(r => columns.map(c => cellText(r[c])))
    );
  }
  return null;
}

function bounded(columns: string[], rows: string[][]): IGovernedTable {
  return {
    columns,
    rows: rows.slice(0, MAX_TABLE_ROWS),
    omitted: Math.max(0, rows.length - MAX_TABLE_ROWS)
  };
}

/** Any JSON value as a bounded line of text (shown as a text node, never as markup). */
export function cellText(value: unknown): string {
  let out: string;
  if (value === undefined || value === null) {
    out = '';
  } else if (typeof value === 'string') {
    out = value;
  } else {
    try {
      out = JSON.stringify(value) ?? String(value);
    } catch {
      out = String(value);
    }
  }
  return out.length > MAX_CELL_CHARS ? `${out.slice(0, MAX_CELL_CHARS)}…` : out;
}

// -- small display helpers ---------------------------------------------------------------------

/** `1.2 kB`, `3.4 MB`. */
export function formatSize(bytes: number): string {
  if (bytes < 1000) {
    return `${bytes} B`;
  }
  if (bytes < 1_000_000) {
    return `${(bytes / 1000).toFixed(1)} kB`;
  }
  return `${(bytes / 1_000_000).toFixed(1)} MB`;
}

/** The kind as the list shows it: `markdown`, `code · python`, `file · image/png`. */
export function kindLabel(artifact: Pick<IArtifact, 'kind' | 'language' | 'mime' | 'governed'>): string {
  if (isGovernedArtifact({ ...artifact })) {
    return 'governed result';
  }
  if (artifact.kind === 'code' && artifact.language) {
    return `code · ${artifact.language}`;
  }
  if (artifact.kind === 'file' && artifact.mime) {
    return `file · ${artifact.mime}`;
  }
  return artifact.kind;
}

/** The file name of a `Content-Disposition: attachment; filename="…"` header. */
export function attachmentName(header: string | null, fallback: string): string {
  const match = header ? /filename="([^"]+)"/.exec(header) : null;
  const name = match ? match[1].replace(/[\\/]/g, '_').trim() : '';
  return name || fallback;
}

/** Tool names whose settling may have written an artifact (create, update, edit, staged, files). */
export function mayWriteArtifacts(toolName: string): boolean {
  return /artifact/.test(toolName) || toolName === 'run_code' || toolName === 'manage_library';
}
