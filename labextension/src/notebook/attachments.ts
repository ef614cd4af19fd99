/**
 * The notebooks attached to a conversation's composer. They stay attached to each message
 * sent there until removed, and each message pins them afresh: the server reads the saved
 * notebook again (the same bytes reuse the same version), so every turn sees the notebook as
 * it is when the message is sent.
 */
import { KaizenApi, Result } from '../api';
import { attachNotebook } from './api';

export class NotebookAttachments {
  constructor(
    private readonly _api: KaizenApi,
    private readonly _conversationId: string
  ) {}

  /** `useSyncExternalStore` contract (as `model.ts`'s Observable, without importing it). */
  readonly subscribe = (listener: () => void): (() => void) => {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  };

  readonly getSnapshot = (): readonly string[] => this._value;

  private set(value: readonly string[]): void {
    this._value = value;
    for (const listener of [...this._listeners]) {
      listener();
    }
  }

  add(path: string): void {
    if (!this._value.includes(path)) {
      this.set([...this._value, path]);
    }
  }

  remove(path: string): void {
    this.set(this._value.filter(p => p !== path));
  }

  /** Attach each notebook now; the artifact ids to name in the message. */
  async pin(): Promise<Result<string[]>> {
    const ids: string[] = [];
    for (const path of this._value) {
      const attached = await attachNotebook(this._api, this._conversationId, path);
      if (!attached.ok) {
        return attached;
      }
      ids.push(attached.value.artifact_id);
    }
    return { ok: true, value: ids };
  }

  private _value: readonly string[] = [];
  private readonly _listeners = new Set<() => void>();
}
