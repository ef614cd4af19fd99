/**
 * The chat canvas of one tool call: the rich output the backend journaled on
 * the call's `tool.settled` as `canvas`, turned into what the panel may put on screen.
 *
 * The backend already validated and bounded every item (kaizen_server_extension/tools/
 * canvas.py); this pure derivation checks again, because whatever reaches the DOM is decided
 * here: Markdown goes to the sanitizing renderer answers use, never to raw HTML; an image
 * becomes an `<img>` whose source is a `data:image/png;base64,` URI built from base64 that
 * starts with the PNG signature — no other scheme or type can be produced. An item that fails
 * a check is left out. A dropped canvas (`canvas_dropped`) shows a short note instead: the
 * model was told nothing was rendered, and the member sees the same.
 */
import { isRecord } from './protocol';

/** Items of one call's canvas (the backend's MAX_CANVAS_ITEMS). */
export const MAX_CANVAS_ITEMS = 8;
/** Characters of one Markdown item (MAX_CANVAS_MARKDOWN_CHARS). */
export const MAX_CANVAS_MARKDOWN_CHARS = 20000;
/** Base64 characters of one image: 512 KiB decoded (MAX_CANVAS_IMAGE_BYTES). */
export const MAX_CANVAS_IMAGE_CHARS = Math.ceil((512 * 1024) / 3) * 4;
/** Pixels of an image side (MAX_CANVAS_IMAGE_SIDE). */
export const MAX_CANVAS_IMAGE_SIDE = 8192;
/** Characters of a title or an alternative text (MAX_CANVAS_LABEL_CHARS). */
export const MAX_CANVAS_LABEL_CHARS = 200;

/** Shown where a canvas was dropped. */
export const CANVAS_DROPPED_TEXT = 'This output could not be shown, so nothing was rendered.';
/** The alternative text of an image that came without one. */
export const DEFAULT_IMAGE_ALT = 'An image the tool displayed';

// The PNG signature (and the first bits of the IHDR chunk that must follow it), in base64.
const PNG_BASE64_PREFIX = 'iVBORw0KGgo';
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

export interface ICanvasMarkdown {
  kind: 'markdown';
  key: string;
  title: string | null;
  markdown: string;
}

export interface ICanvasImage {
  kind: 'image';
  key: string;
  /** Always `data:image/png;base64,<checked base64>`. */
  src: string;
  alt: string;
  width: number | null;
  height: number | null;
}

export type CanvasEntry = ICanvasMarkdown | ICanvasImage;

export interface ICallCanvas {
  entries: CanvasEntry[];
  /** The call had a canvas that could not be shown. */
  dropped: boolean;
}

export interface ICanvasSource {
  callId: string;
  canvas?: unknown;
  canvasDropped?: boolean;
}

/** What one tool call shows on the chat canvas. */
export function callCanvas(call: ICanvasSource): ICallCanvas {
  const items = Array.isArray(call.canvas) ? call.canvas.slice(0, MAX_CANVAS_ITEMS) : [];
  const entries: CanvasEntry[] = [];
  items.forEach((item, index) => {
    const key = `${call.callId}-canvas-${index}`;
    const entry = isRecord(item) ? canvasEntry(item, key) : null;
    if (entry) {
      entries.push(entry);
    }
  });
  return { entries, dropped: call.canvasDropped === true };
}

function canvasEntry(item: Record<string, unknown>, key: string): CanvasEntry | null {
  if (item.kind === 'markdown') {
    const markdown = item.markdown;
    if (typeof markdown !== 'string' || !markdown.trim() || markdown.length > MAX_CANVAS_MARKDOWN_CHARS) {
      return null;
    }
    return { kind: 'markdown', key, title: label(item.title), markdown };
  }
  if (item.kind === 'image') {
    const src = pngDataUri(item.media_type, item.data);
    if (src === null) {
      return null;
    }
    return {
      kind: 'image',
      key,
      src,
      alt: label(item.alt) ?? DEFAULT_IMAGE_ALT,
      width: side(item.width),
      height: side(item.height)
    };
  }
  return null;
}

/**
 * The `data:` URI of a PNG given as base64, or null for anything else: another media type,
 * characters outside the base64 alphabet (so nothing can end the URI or add to it), a length
 * over the bound, or bytes that do not start with the PNG signature.
 */
export function pngDataUri(mediaType: unknown, data: unknown): string | null {
  if (mediaType !== 'image/png' || typeof data !== 'string') {
    return null;
  }
  if (data.length > MAX_CANVAS_IMAGE_CHARS || data.length % 4 !== 0) {
    return null;
  }
  if (!data.startsWith(PNG_BASE64_PREFIX) || !BASE64.test(data)) {
    return null;
  }
  return `data:image/png;base64,${data}`;
}

function label(value: unknown): string | null {
  if (typeof value !== 'string' || !value.trim()) {
    return null;
  }
  return value.length > MAX_CANVAS_LABEL_CHARS ? `${value.slice(0, MAX_CANVAS_LABEL_CHARS)}…` : value;
}

function side(value: unknown): number | null {
  return typeof value === 'number' && Number.isInteger(value) && value > 0 && value <= MAX_CANVAS_IMAGE_SIDE
    ? value
    : null;
}
