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
import { IConversationState, isTerminal } from './journal';
import { Loadable, Observable } from './model';
import { isRecord } from './protocol';

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
    if (!selectedId) {
      return;
    }
    const version = view?.phase === 'ready' ? view.value.version : this._value.pickedVersion;
    await this.downloadVersion(selectedId, version, save);
  }

  /**
   * Download one exact version (a generated file's, R-236) through the same download route;
   * null is the latest visible version.
   */
  async downloadVersion(artifactId: string, version: number | null, save: SaveFile): Promise<void> {
    if (this._value.downloading) {
      return;
    }
    this.set({ ...this._value, downloading: true, message: null });
    const result = await this._api.downloadArtifact(artifactId, version, this.conversationId);
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

// -- generation placeholders (R-236) ----------------------------------------------------------

/** A declared run_code output while its call runs: shown, never downloadable. */
export interface IGeneratingFile {
  state: 'generating';
  /** Unique in the conversation: run, call and target. */
  key: string;
  runId: string;
  callId: string;
  target: string;
}

/** The durable file a placeholder became: downloadable through the ordinary route. */
export interface IGeneratedFile {
  state: 'ready';
  key: string;
  runId: string;
  callId: string;
  target: string;
  artifactId: string;
  version: number;
  filename: string;
  mediaType: string;
}

export type GenerationEntry = IGeneratingFile | IGeneratedFile;

/**
 * The generation placeholders of a conversation, from its journal state alone.
 *
 * A run_code call's `tool.requested` carries one placeholder per declared target, and its
 * `tool.settled` (the same run and call id) the durable file stored for each target that was
 * produced. Per placeholder, in call order:
 *
 * - call not settled, run not ended: `generating`;
 * - call settled with a file for the target: `ready`, that exact artifact version;
 * - call settled without one (a failed or refused call, a recovered call): removed;
 * - run ended while the call never settled: removed.
 *
 * The state is a fold over durable events, so a frame lost on the socket is settled from the
 * journal page the feed reads when it reconnects (`after=lastSeq`), and the result is the same
 * as for a fresh rebuild. Only the backend's structured fields count, never the arguments.
 */
export function generationEntries(journal: IConversationState): GenerationEntry[] {
  const entries: GenerationEntry[] = [];
  for (const runId of journal.runOrder) {
    const run = journal.runs[runId];
    for (const call of run.tools) {
      const targets = declaredTargets(call.placeholders);
      if (!targets.length) {
        continue;
      }
      const settled = call.outcome !== undefined;
      if (!settled && isTerminal(run)) {
        continue; // the run ended without the call's files
      }
      const stored = settled ? storedFiles(call.files) : [];
      for (const target of targets) {
        const key = `${runId}/${call.callId}/${target}`;
        const base = { key, runId, callId: call.callId, target };
        if (!settled) {
          entries.push({ state: 'generating', ...base });
          continue;
        }
        const file = stored.find(f => f.target === target);
        if (file) {
          entries.push({ state: 'ready', ...base, ...file });
        }
      }
    }
  }
  return entries;
}

/**
 * What the pane shows of them: every placeholder still generating, and each generated file
 * until the listing carries that version (then the listing's entry is the durable file).
 */
export function visibleGeneration(
  entries: readonly GenerationEntry[],
  listed: readonly IArtifact[]
): GenerationEntry[] {
  return entries.filter(
    entry =>
      entry.state === 'generating' ||
      !listed.some(a => a.id === entry.artifactId && a.latestVersion >= entry.version)
  );
}

/** The placeholders' target names: non-empty strings, each once, in order. */
function declaredTargets(value: unknown): string[] {
  if (!Array.isArray(value)) {
    return [];
  }
  const targets: string[] = [];
  for (const item of value) {
    const target = isRecord(item) ? item.target : undefined;
    if (typeof target === 'string' && target && !targets.includes(target)) {
      targets.push(target);
    }
  }
  return targets;
}

type StoredFile = Pick<IGeneratedFile, 'target' | 'artifactId' | 'version' | 'filename' | 'mediaType'>;

/** The settled call's stored files; an entry that is not a whole, valid file is ignored. */
function storedFiles(value: unknown): StoredFile[] {
  if (!Array.isArray(value)) {
    return [];
  }
  const files: StoredFile[] = [];
  for (const item of value) {
    if (!isRecord(item)) {
      continue;
    }
    const { target, artifact_id: artifactId, version, filename, media_type: mediaType } = item;
    if (
      typeof target === 'string' &&
      target &&
      typeof artifactId === 'string' &&
      artifactId &&
      typeof version === 'number' &&
      Number.isInteger(version) &&
      version >= 1
    ) {
      files.push({
        target,
        artifactId,
        version,
        filename: typeof filename === 'string' && filename ? filename : target,
        mediaType: typeof mediaType === 'string' ? mediaType : ''
      });
    }
  }
  return files;
}
