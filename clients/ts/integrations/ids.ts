/**
 * Conversation ids of a framework's identifiers, injectively: memsvc folds ids (NFC, runs
 * of whitespace, outer spaces), so sessions `"x  y"` and `"x y"`, `"id "` and `"id"`, NFD
 * and NFC `café` would read each other's items. The same rule as the Python adapters'
 * (`memsvc_client/integrations/_ids.py`): an id already in memsvc's normal form and
 * without `%` stands as it is (a tenant's `acme/` prefix included); any other is
 * percent-encoded (UTF-8, every byte but letters, digits, `-._~` and `/`). An encoded id
 * always holds a `%` and a standing one never does, so no two ids share a conversation.
 */

const WS_RUN = /\s{2,}|[^\S ]/u; // two or more spaces in a row, or a tab, newline...
const HIDDEN = /[\p{Cc}\p{Cf}]/u; // control and invisible format characters

function normal(id: string): boolean {
  return (
    !id.includes("%") &&
    id === id.trim() &&
    !WS_RUN.test(id) &&
    id.normalize("NFC") === id &&
    !HIDDEN.test(id)
  );
}

// encodeURIComponent leaves !'()* as they are; Python's quote (the other adapters') does not
function quote(id: string): string {
  return encodeURIComponent(id)
    .replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase())
    .replace(/%2F/g, "/");
}

/** The conversation id of a session id: as it stands when normal, else percent-encoded. */
export function singleId(id: string): string {
  return normal(id) ? id : quote(id);
}
