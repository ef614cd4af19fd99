/**
 * "Open kernel console": the member's own persistent run_code kernel of a conversation,
 * opened as a JupyterLab console so its variables can be inspected.
 *
 * The server tells whether such a kernel exists (`GET conversations/{id}/kernel`) and makes it
 * reachable through the Jupyter kernels API (`POST conversations/{id}/kernel/console`); the
 * panel then asks JupyterLab to open a console on that kernel id (the launcher, index.ts).
 */
import { IConsoleKernel, IConversationKernel, KaizenApi, Result } from './api';
import { Observable } from './model';

export type KernelConsolePhase =
  /** Not asked yet, or being asked. */
  | 'checking'
  /** A persistent kernel is there and may be opened. */
  | 'ready'
  /** No persistent kernel of mine here (yet, or any more). */
  | 'none'
  /** The server does not allow consoles on run_code kernels. */
  | 'disabled'
  /** The status could not be read. */
  | 'unknown';

export interface IKernelConsoleState {
  phase: KernelConsolePhase;
  /** Opening is in progress (the button waits). */
  opening: boolean;
  /** A member-safe sentence after a failed open, or null. */
  message: string | null;
}

/** Opens JupyterLab's console on a kernel id; answers null, or a member-safe sentence. */
export type ConsoleLauncher = (kernel: IConsoleKernel) => Promise<string | null>;

/** Why the button is disabled, in words (also its tooltip). */
export const NO_KERNEL_HINT =
  'No persistent run_code kernel of yours here yet: one exists after a run_code call with ' +
  'persistent=true, until its sandbox lease idles out.';
export const DISABLED_HINT = 'Opening run_code kernels as consoles is not available on this server.';
export const READY_HINT = "Open this conversation's persistent run_code kernel in a JupyterLab console";

type KernelApi = Pick<KaizenApi, 'conversationKernel' | 'openKernelConsole'>;

/** What the conversation view shows for the action. */
export function consoleButton(state: IKernelConsoleState): { enabled: boolean; title: string } {
  switch (state.phase) {
    case 'ready':
      return { enabled: !state.opening, title: READY_HINT };
    case 'disabled':
      return { enabled: false, title: DISABLED_HINT };
    case 'none':
      return { enabled: false, title: NO_KERNEL_HINT };
    default:
      // Unknown or still checking: let the member try; the server decides.
      return { enabled: !state.opening, title: READY_HINT };
  }
}

export function phaseOf(status: IConversationKernel, language = 'python'): KernelConsolePhase {
  if (!status.console_enabled) {
    return 'disabled';
  }
  return status.kernels.some(k => k.language === language) ? 'ready' : 'none';
}

/** The console action of one conversation. */
export class KernelConsoleModel extends Observable<IKernelConsoleState> {
  constructor(
    private readonly _api: KernelApi,
    readonly conversationId: string,
    readonly language = 'python'
  ) {
    super({ phase: 'checking', opening: false, message: null });
  }

  /** Ask the server whether a persistent kernel of mine is here. */
  async refresh(): Promise<void> {
    const ticket = ++this._ticket;
    const result: Result<IConversationKernel> = await this._api.conversationKernel(
      this.conversationId
    );
    if (ticket !== this._ticket) {
      return; // a newer answer is on its way
    }
    this.set({ ...this._value, phase: result.ok ? phaseOf(result.value, this.language) : 'unknown' });
  }

  /**
   * Attach the kernel (server) and open a console on it (JupyterLab). Answers null when the
   * console opened, else the member-safe sentence also kept in `message`.
   */
  async open(launch: ConsoleLauncher): Promise<string | null> {
    if (this._value.opening) {
      return null;
    }
    this.set({ ...this._value, opening: true, message: null });
    const attached = await this._api.openKernelConsole(this.conversationId, this.language);
    if (!attached.ok) {
      // Whatever the server said, its view of the kernel is now the truth.
      ++this._ticket;
      const phase: KernelConsolePhase =
        attached.status === 404 ? 'none' : attached.status === 403 ? 'disabled' : this._value.phase;
      this.set({ phase, opening: false, message: attached.message });
      return attached.message;
    }
    let failure: string | null;
    try {
      failure = await launch(attached.value);
    } catch {
      failure = 'JupyterLab could not open the console.';
    }
    this.set({ phase: 'ready', opening: false, message: failure });
    return failure;
  }

  dismiss(): void {
    this.set({ ...this._value, message: null });
  }

  private _ticket = 0;
}
