/**
 * The artifacts pane of one conversation: the listing, the selected artifact and version,
 * and downloads. A small external store (`Observable`) for `useSyncExternalStore`.
 *
 * The pane refreshes on open and whenever the journal shows an artifact write
 * (`IConversationState.artifactSeq` moves). Refreshes are coalesced: one in flight, at most
 * one more after it, so a burst of events is two requests, not one per event.
 */
import { KaizenApi, Result } from './api';
import { IArtifact, IArtifactView } from './artifacts';
import { Loadable, Observable } from './model';

type ArtifactsApi = Pick<KaizenApi, 'artifacts' | 'artifact' | 'downloadArtifact'>;

export interface IArtifactsState {
  list: Loadable<IArtifact[]>;
  selectedId: string | null;
  /** The version the member picked; null follows the latest. */
  pickedVersion: number | null;
  /** The shown version (with content), while loading, or the sentence why it failed. */
  view: Loadable<IArtifactView> | null;
  downloading: boolean;
  /** A member-safe sentence from the last failed download, or null. */
  message: string | null;
}

/** Hands a downloaded file to the browser (a seam: tests record it, the pane clicks a link). */
export type SaveFile = (blob: Blob, filename: string) => void;

export class ArtifactsModel extends Observable<IArtifactsState> {
  constructor(
    private readonly _api: ArtifactsApi,
    readonly conversationId: string
  ) {
    super({
      list: { phase: 'loading' },
      selectedId: null,
      pickedVersion: null,
      view: null,
      downloading: false,
      message: null
    });
  }

  /** Reload the listing (and the shown version when it follows the latest and that moved). */
  async refresh(): Promise<void> {
    if (this._refreshing) {
      this._again = true;
      return this._refreshing;
    }
    this._refreshing = (async () => {
      do {
        this._again = false;
        await this._load();
      } while (this._again);
    })();
    try {
      await this._refreshing;
    } finally {
      this._refreshing = null;
    }
  }

  /** Show an artifact (its latest visible version). */
  async select(artifactId: string | null): Promise<void> {
    this.set({ ...this._value, selectedId: artifactId, pickedVersion: null, message: null });
    await this._loadView();
  }

  /** Show one version of the selected artifact. */
  async pickVersion(version: number | null): Promise<void> {
    if (!this._value.selectedId) {
      return;
    }
    this.set({ ...this._value, pickedVersion: version, message: null });
    await this._loadView();
  }

  /** Download the shown version through the download route. */
  async download(save: SaveFile): Promise<void> {
    const { selectedId, view } = this._value;
    if (!selectedId || this._value.downloading) {
      return;
    }
    const version = view?.phase === 'ready' ? view.value.version : this._value.pickedVersion;
    this.set({ ...this._value, downloading: true, message: null });
    const result = await this._api.downloadArtifact(selectedId, version, this.conversationId);
    if (result.ok) {
      try {
        save(result.value.blob, result.value.filename);
      } catch {
        this.set({ ...this._value, downloading: false, message: 'The browser refused the download.' });
        return;
      }
    }
    this.set({ ...this._value, downloading: false, message: result.ok ? null : result.message });
  }

  dismiss(): void {
    this.set({ ...this._value, message: null });
  }

  private async _load(): Promise<void> {
    const result = await this._api.artifacts(this.conversationId);
    if (!result.ok) {
      // A listing already shown stays; the failure shows only when there is nothing else.
      if (this._value.list.phase !== 'ready') {
        this.set({ ...this._value, list: { phase: 'error', message: result.message } });
      }
      return;
    }
    const list = result.value;
    this.set({ ...this._value, list: { phase: 'ready', value: list } });
    const { selectedId, pickedVersion, view } = this._value;
    if (!selectedId) {
      return;
    }
    const listed = list.find(a => a.id === selectedId);
    if (!listed) {
      this.set({ ...this._value, selectedId: null, pickedVersion: null, view: null });
      return;
    }
    const shownVersion = view?.phase === 'ready' ? view.value.version : null;
    if (pickedVersion === null && shownVersion !== listed.version) {
      await this._loadView();
    }
  }

  private async _loadView(): Promise<void> {
    const { selectedId, pickedVersion } = this._value;
    const ticket = ++this._viewTicket;
    if (!selectedId) {
      this.set({ ...this._value, view: null });
      return;
    }
    const current = this._value.view;
    // Keep showing the current version while the next loads (no flash of "loading").
    if (!current || current.phase !== 'ready' || current.value.id !== selectedId) {
      this.set({ ...this._value, view: { phase: 'loading' } });
    }
    const result: Result<IArtifactView> = await this._api.artifact(
      selectedId,
      pickedVersion,
      this.conversationId
    );
    if (ticket !== this._viewTicket) {
      return; // a newer selection is on its way
    }
    this.set({
      ...this._value,
      view: result.ok
        ? { phase: 'ready', value: result.value }
        : { phase: 'error', message: result.message }
    });
  }

  private _refreshing: Promise<void> | null = null;
  private _again = false;
  private _viewTicket = 0;
}
