/**
 * The event feed of one conversation: the journal history page by page over REST, then the
 * live websocket from the last applied seq; on a dropped socket, reconnect with backoff and
 * resume from the last applied seq (`?after=`). Duplicates from overlaps are dropped by the
 * reducer (by seq), so nothing is applied twice and nothing between is skipped.
 *
 * No JupyterLab import: the socket constructor and the page loader are injected, so the
 * resume logic is unit-tested with fakes.
 */
import { Frame, IJournalEvent, parseFrame } from './protocol';

/** The part of the browser `WebSocket` the feed uses. */
export interface ISocket {
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason?: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  close(code?: number, reason?: string): void;
}

export type SocketFactory = (url: string) => ISocket;

export type PageResult =
  | { ok: true; value: { events: IJournalEvent[]; next: number } }
  | { ok: false; message: string; status: number };

export interface IFeedOptions {
  conversationId: string;
  /** `GET conversations/{id}/journal?after&limit`. */
  loadPage: (after: number, limit: number) => Promise<PageResult>;
  /** The websocket URL resuming after `after`. */
  socketUrl: (after: number) => string;
  openSocket: SocketFactory;
  /** The seq to resume from: the reducer's `lastSeq` (what was really applied). */
  lastSeq: () => number;
  /** Frames to apply, in order; `live` is true for socket frames after the history load. */
  onFrames: (frames: Frame[], live: boolean) => void;
  onStatus: (status: FeedStatus) => void;
  pageSize?: number;
  setTimer?: (fn: () => void, ms: number) => unknown;
  clearTimer?: (handle: unknown) => void;
}

export type FeedStatus =
  | { phase: 'loading' }
  | { phase: 'live' }
  | { phase: 'reconnecting'; attempt: number; message: string }
  | { phase: 'failed'; message: string }
  | { phase: 'closed' };

/** Close code the server uses for "not a participant (any more)". */
export const CLOSE_NOT_PARTICIPANT = 4404;

/** Delay before reconnect attempt `n` (1-based): 0.5 s, 1 s, 2 s, … capped at 15 s. */
export function backoffDelay(attempt: number): number {
  return Math.min(15000, 500 * 2 ** Math.max(0, attempt - 1));
}

/** The member-safe sentence for a socket close. */
export function closeMessage(code: number): string {
  if (code === CLOSE_NOT_PARTICIPANT) {
    return 'You are no longer a participant of this conversation.';
  }
  if (code === 1011) {
    return 'The server had a problem with the live connection. Reconnecting…';
  }
  return 'The live connection was interrupted. Reconnecting…';
}

export class ConversationFeed {
  constructor(options: IFeedOptions) {
    this._o = options;
    this._pageSize = options.pageSize ?? 200;
    this._setTimer = options.setTimer ?? ((fn, ms) => setTimeout(fn, ms));
    this._clearTimer =
      options.clearTimer ?? (handle => clearTimeout(handle as ReturnType<typeof setTimeout>));
  }

  /** Load the history after the current `lastSeq`, then go live. */
  async start(): Promise<void> {
    this._o.onStatus({ phase: 'loading' });
    const loaded = await this.loadHistory();
    if (this._disposed) {
      return;
    }
    if (!loaded.ok) {
      this._o.onStatus({ phase: 'failed', message: loaded.message });
      return;
    }
    this._connect();
  }

  /** Page through `GET journal` from `lastSeq` until a short page. */
  async loadHistory(): Promise<{ ok: true } | { ok: false; message: string }> {
    for (;;) {
      const after = this._o.lastSeq();
      const page = await this._o.loadPage(after, this._pageSize);
      if (this._disposed) {
        return { ok: true };
      }
      if (!page.ok) {
        return { ok: false, message: page.message };
      }
      if (page.value.events.length) {
        this._o.onFrames(page.value.events, false);
      }
      if (page.value.events.length < this._pageSize || this._o.lastSeq() <= after) {
        return { ok: true };
      }
    }
  }

  /** Close the socket for good (switching conversation, panel disposed). */
  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      this._clearTimer(this._timer);
      this._timer = null;
    }
    const socket = this._socket;
    this._socket = null;
    if (socket) {
      socket.onclose = null;
      socket.onmessage = null;
      socket.close(1000, 'closed by the panel');
    }
    this._o.onStatus({ phase: 'closed' });
  }

  get disposed(): boolean {
    return this._disposed;
  }

  /** Drop the socket as a network failure would (for tests and the "reconnect" button). */
  reconnectNow(): void {
    if (this._disposed) {
      return;
    }
    if (this._timer !== null) {
      this._clearTimer(this._timer);
      this._timer = null;
    }
    const socket = this._socket;
    this._socket = null;
    if (socket) {
      socket.onclose = null;
      socket.onmessage = null;
      socket.close(1000, 'reconnect');
    }
    this._connect();
  }

  private _connect(): void {
    if (this._disposed) {
      return;
    }
    let socket: ISocket;
    try {
      socket = this._o.openSocket(this._o.socketUrl(this._o.lastSeq()));
    } catch (reason) {
      console.warn('Kaizen: could not open the events socket', reason);
      this._scheduleReconnect(1006);
      return;
    }
    this._socket = socket;
    socket.onopen = () => {
      if (this._socket === socket) {
        this._attempt = 0;
        this._o.onStatus({ phase: 'live' });
      }
    };
    socket.onmessage = ev => {
      if (this._socket !== socket || typeof ev.data !== 'string') {
        return;
      }
      let value: unknown;
      try {
        value = JSON.parse(ev.data);
      } catch {
        return;
      }
      const frame = parseFrame(value);
      if (frame) {
        this._o.onFrames([frame], true);
      }
    };
    socket.onerror = () => {
      // onclose follows; it decides.
    };
    socket.onclose = ev => {
      if (this._socket !== socket) {
        return;
      }
      this._socket = null;
      if (ev.code === CLOSE_NOT_PARTICIPANT) {
        this._o.onStatus({ phase: 'failed', message: closeMessage(ev.code) });
        return;
      }
      this._scheduleReconnect(ev.code);
    };
  }

  private _scheduleReconnect(code: number): void {
    if (this._disposed) {
      return;
    }
    this._attempt += 1;
    this._o.onStatus({
      phase: 'reconnecting',
      attempt: this._attempt,
      message: closeMessage(code)
    });
    this._timer = this._setTimer(() => {
      this._timer = null;
      // Catch up over REST first when the socket keeps failing (e.g. a proxy that drops
      // websockets): the journal still advances, then try the socket again.
      void this.loadHistory().then(() => this._connect());
    }, backoffDelay(this._attempt));
  }

  private readonly _o: IFeedOptions;
  private readonly _pageSize: number;
  private readonly _setTimer: (fn: () => void, ms: number) => unknown;
  private readonly _clearTimer: (handle: unknown) => void;
  private _socket: ISocket | null = null;
  private _timer: unknown = null;
  private _attempt = 0;
  private _disposed = false;
}
