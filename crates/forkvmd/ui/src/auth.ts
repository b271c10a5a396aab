// auth.ts — where the bearer token comes from and goes: the URL fragment
// (`/ui/#token=...`, taken once and wiped from the address bar), sessionStorage
// after that, else the login form; a 401 brings the form back. Also the WebSocket
// subprotocols that carry the token, since a browser WebSocket sends no headers.

const KEY = "forkvm.token";
let token: string | null = null;
let listener: (() => void) | null = null;

/** Takes `#token=` from the address (then removes the fragment); null when absent. */
function tokenFromFragment(): string | null {
  // Not URLSearchParams: it reads `+` as a space, and a base64 token holds `+`.
  const pair = location.hash
    .replace(/^#/, "")
    .split("&")
    .find((p) => p.startsWith("token="));
  let t: string | null = null;
  try {
    t = pair ? decodeURIComponent(pair.slice("token=".length)) : null;
  } catch {
    t = null; // a malformed %-escape: ask instead
  }
  if (!t) return null;
  setToken(t);
  history.replaceState(null, "", location.pathname + location.search);
  return t;
}

/** Reads the token from `#token=` (then removes the fragment) or sessionStorage. */
export function initToken(): string | null {
  if (tokenFromFragment()) return token;
  try {
    token = sessionStorage.getItem(KEY);
  } catch {
    token = null;
  }
  return token;
}

export function getToken(): string | null {
  return token;
}

export function setToken(t: string): void {
  token = t;
  try {
    sessionStorage.setItem(KEY, t);
  } catch {
    // Storage refused (private mode): the token lives as long as the page.
  }
}

function loginEl(): HTMLElement {
  return document.getElementById("login") as HTMLElement;
}

/** Shows the login form (with why, when given). */
export function showLogin(message?: string): void {
  const form = loginEl();
  form.hidden = false;
  document.body.classList.add("logged-out");
  const msg = document.getElementById("login-message");
  if (msg) msg.textContent = message ?? "";
  (document.getElementById("login-token") as HTMLInputElement).focus();
}

/** Wires the login form; `onLogin` runs each time a token is submitted. */
export function setupLogin(onLogin: () => void): void {
  listener = onLogin;
  const form = loginEl();
  const input = document.getElementById("login-token") as HTMLInputElement;
  const submit = () => {
    const t = input.value.trim();
    if (!t) return;
    setToken(t);
    input.value = "";
    form.hidden = true;
    document.body.classList.remove("logged-out");
    listener?.();
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    submit();
  });
  document.getElementById("login-submit")?.addEventListener("click", (ev) => {
    ev.preventDefault();
    submit();
  });
  // A `#token=` pasted into the address bar of an open page arrives without a reload.
  window.addEventListener("hashchange", () => {
    if (!tokenFromFragment()) return;
    form.hidden = true;
    document.body.classList.remove("logged-out");
    listener?.();
  });
}

/** A 401: the token is wrong or gone. */
export function onUnauthorized(): void {
  showLogin("The daemon refused the token (401). Enter it again.");
}

/** `["forkvm", "forkvm.bearer.<hex of the token's UTF-8>"]`: the daemon picks `forkvm`. */
export function wsProtocols(): string[] {
  const t = token ?? "";
  let hex = "";
  for (const b of new TextEncoder().encode(t)) hex += b.toString(16).padStart(2, "0");
  return t ? ["forkvm", `forkvm.bearer.${hex}`] : ["forkvm"];
}
