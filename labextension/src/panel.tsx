/**
 * The Kaizen side panel (a `ReactWidget`): the conversation list, or one open conversation.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { ReactWidget } from '@jupyterlab/ui-components';
import React, { useCallback, useEffect, useSyncExternalStore } from 'react';

import { KaizenApi } from './api';
import { ChatView } from './components/ChatView';
import { ConversationList } from './components/ConversationList';
import { ICodeActions } from './components/Markdown';
import { CitationContext, CitationOpener } from './documents';
import { IJupyterHost, JupyterHostContext } from './jupyterHost';
import { ConsoleLauncher } from './kernelConsole';
import { PanelModel } from './model';
import { NotebookToolsContext } from './notebook/context';
import { INotebookEditor } from './notebook/editor';

export interface IKaizenAppProps {
  model: PanelModel;
  rendermime: IRenderMimeRegistry;
  codeActions: ICodeActions;
  launchConsole?: ConsoleLauncher;
  openDocuments?: () => void;
}

export function KaizenApp({
  model,
  rendermime,
  codeActions,
  launchConsole,
  openDocuments
}: IKaizenAppProps): JSX.Element {
  const state = useSyncExternalStore(model.subscribe, model.getSnapshot);
  const preferences = useSyncExternalStore(
    model.preferences.subscribe,
    model.preferences.getSnapshot
  );
  useEffect(() => {
    void model.refresh();
  }, [model]);
  const agentList = state.agents.phase === 'ready' ? state.agents.value : null;
  const agentNames = useCallback(
    (agentId: string) => agentList?.find(a => a.id === agentId)?.name ?? agentId,
    [agentList]
  );

  const selected = model.conversationModel(state.selectedId);
  if (selected) {
    const agents = state.agents.phase === 'ready' ? state.agents.value : [];
    const agent = agents.find(a => a.id === selected.conversation.agent_id);
    return (
      <ChatView
        key={selected.conversation.id}
        model={selected}
        me={state.me?.member ?? null}
        agentName={agent?.name ?? selected.conversation.agent_id}
        agentNames={agentNames}
        preferences={preferences}
        rendermime={rendermime}
        codeActions={codeActions}
        launchConsole={launchConsole}
        onBack={() => {
          model.select(null);
          void model.refresh();
        }}
      />
    );
  }
  return (
    <ConversationList
      agents={state.agents}
      conversations={state.conversations}
      activity={state.activity}
      defaultAgent={preferences.defaultAgent}
      error={state.error}
      onCreate={(agentId, shared, title) => model.create(agentId, shared, title)}
      onOpen={id => model.select(id)}
      onRefresh={() => void model.refresh()}
      onDismissError={() => model.dismissError()}
      onOpenDocuments={openDocuments}
    />
  );
}

/** The Kaizen side panel. */
export class KaizenPanel extends ReactWidget {
  constructor(options: {
    api: KaizenApi;
    rendermime: IRenderMimeRegistry;
    codeActions: ICodeActions;
    launchConsole?: ConsoleLauncher;
    model?: PanelModel;
    notebookEditor?: INotebookEditor | null;
    host?: IJupyterHost;
    /** Opens a cited passage; without it citations stay plain text. */
    openCitation?: CitationOpener;
    /** Opens the member's documents list (the "Documents" button). */
    openDocuments?: () => void;
  }) {
    super();
    this.model = options.model ?? new PanelModel(options.api);
    this._rendermime = options.rendermime;
    this._codeActions = options.codeActions;
    this._launchConsole = options.launchConsole;
    this._notebookTools = { api: this.model.api, editor: options.notebookEditor ?? null };
    this._host = options.host ?? { currentFolder: () => '' };
    this._openCitation = options.openCitation ?? null;
    this._openDocuments = options.openDocuments;
    this.addClass('jp-Kaizen-panel');
  }

  readonly model: PanelModel;

  protected render(): JSX.Element {
    return (
      <NotebookToolsContext.Provider value={this._notebookTools}>
      <JupyterHostContext.Provider value={this._host}>
      <CitationContext.Provider value={this._openCitation}>
        <KaizenApp
          model={this.model}
          rendermime={this._rendermime}
          codeActions={this._codeActions}
          launchConsole={this._launchConsole}
          openDocuments={this._openDocuments}
        />
      </CitationContext.Provider>
      </JupyterHostContext.Provider>
      </NotebookToolsContext.Provider>
    );
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.model.dispose();
    super.dispose();
  }

  private readonly _rendermime: IRenderMimeRegistry;
  private readonly _codeActions: ICodeActions;
  private readonly _launchConsole?: ConsoleLauncher;
  private readonly _notebookTools: { api: KaizenApi; editor: INotebookEditor | null };
  private readonly _host: IJupyterHost;
  private readonly _openCitation: CitationOpener | null;
  private readonly _openDocuments?: () => void;
}
