/**
 * "Kaizen Documents": a main-area list of the documents the member may read (their own, and
 * those shared into a room they are in), with where each came from in Jupyter, its version
 * and passages; open one, or remove one they own.
 */
import { Widget } from '@lumino/widgets';

import { KaizenApi } from './api';
import { CitationOpener, IDocumentSummary, listDocuments, removeDocument } from './documents';
import { element } from './dom';

export const DOCUMENTS_VIEW_ID = 'kaizen-documents';

export interface IDocumentsListOptions {
  api: KaizenApi;
  /** Opens a document's current version (no passage cited). */
  open: CitationOpener;
  /** Asks the member to confirm removing a document; resolves true to go ahead. */
  confirmRemove: (title: string) => Promise<boolean>;
  /** The member's id: only their own documents can be removed. */
  me: () => string | null;
}

export class DocumentsList extends Widget {
  constructor(private readonly _options: IDocumentsListOptions) {
    super();
    this.id = DOCUMENTS_VIEW_ID;
    this.addClass('jp-Kaizen-documentsList');
    this.title.label = 'Kaizen Documents';
    this.title.closable = true;
  }

  /** Load the list again (after an add, a removal, or on the member's request). */
  async refresh(): Promise<void> {
    const loading = ++this._loads;
    this.node.dataset.state = 'loading';
    const listed = await listDocuments(this._options.api);
    if (loading !== this._loads) {
      return;
    }
    const header = element('header', 'jp-Kaizen-documentHeader');
    const refresh = this._button('Refresh', () => void this.refresh());
    header.append(element('h2', 'jp-Kaizen-documentTitle', 'Kaizen Documents'), refresh);
    if (!listed.ok) {
      const error = element('p', 'jp-Kaizen-error', listed.message);
      error.setAttribute('role', 'alert');
      this.node.replaceChildren(header, error);
      this.node.dataset.state = 'error';
      return;
    }
    const documents = listed.value;
    if (!documents.length) {
      this.node.replaceChildren(
        header,
        element(
          'p',
          'jp-Kaizen-empty',
          'No documents yet. Right-click a file in the file browser and choose "Add to Kaizen Documents".'
        )
      );
    } else {
      const list = element('ul', 'jp-Kaizen-documentItems');
      for (const doc of documents) {
        list.append(this._item(doc));
      }
      this.node.replaceChildren(header, list);
    }
    this.node.dataset.state = 'ready';
  }

  protected onAfterAttach(): void {
    void this.refresh();
  }

  private _item(doc: IDocumentSummary): HTMLElement {
    const item = element('li', 'jp-Kaizen-documentItem');
    item.dataset.documentId = doc.id;
    const facts = [`v${doc.version}`, doc.chunks === 1 ? '1 passage' : `${doc.chunks} passages`];
    if (doc.sourcePath) {
      facts.unshift(doc.sourcePath);
      item.dataset.path = doc.sourcePath;
    }
    if (doc.owner !== this._options.me()) {
      facts.push(`shared by ${doc.owner}`);
    }
    const open = this._button(doc.title, () =>
      this._options.open({ documentId: doc.id, version: doc.version, chunkId: '' }, doc.title)
    );
    open.classList.add('jp-Kaizen-documentOpen');
    item.append(open, element('span', 'jp-Kaizen-documentFacts', facts.join(' · ')));
    if (doc.owner === this._options.me()) {
      const remove = this._button('Remove', async () => {
        if (!(await this._options.confirmRemove(doc.title))) {
          return;
        }
        const removed = await removeDocument(this._options.api, doc.id);
        if (!removed.ok) {
          const error = element('span', 'jp-Kaizen-error', removed.message);
          error.setAttribute('role', 'alert');
          item.append(error);
          return;
        }
        await this.refresh();
      });
      remove.classList.add('jp-Kaizen-documentRemove');
      remove.setAttribute('aria-label', `Remove ${doc.title} from your Kaizen documents`);
      item.append(remove);
    }
    return item;
  }

  private _button(label: string, onClick: () => void): HTMLButtonElement {
    const button = element('button', 'jp-Button jp-mod-styled jp-Kaizen-secondary', label) as HTMLButtonElement;
    button.type = 'button';
    button.addEventListener('click', onClick);
    return button;
  }

  private _loads = 0;
}
