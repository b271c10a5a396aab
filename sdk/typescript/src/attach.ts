/**
 * A background process on a WebSocket (`GET /v1/sandboxes/{id}/processes/{pid}/attach`):
 * its output out and its input in on one connection, as a terminal needs it. Iterate a
 * `ProcessSocket` for output chunks until the process ends (then `process` says how);
 * `send` types, `resize`, `signal` and `closeStdin` are controls; `close` detaches (the
 * process runs on). Binary messages out are output whose first byte is the stream (1
 * stdout, 2 stderr); text messages are the daemon's `ProcessOutputEvent` lines. Spoken
 * by undici's WebSocket over the controller's own dispatcher (Unix socket or TCP).
 */

import { WebSocket, type Dispatcher } from "undici";
import { ConnectionFailed, ForkvmError, ProtocolError } from "./errors.js";
import type * as T from "./types.js";

/** Bytes a process wrote; `offset` is that of the first. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  offset: number;
  data: Uint8Array;
}

const STREAMS: Record<number, "stdout" | "stderr"> = { 1: "stdout", 2: "stderr" };

type Item = { chunk: OutputChunk } | { done: true } | { error: Error };

export class ProcessSocket implements AsyncIterable<OutputChunk> {
  /** The offset of the next output byte. */
  offset = 0;
  /** Bytes asked for that had left the ring. */
  skipped = 0;
  /** How the process stood when it ended (unset while it runs). */
  process?: T.ProcessInfo;
  readonly #ws: WebSocket;
  readonly #url: string;
  readonly #items: Item[] = [];
  #wake?: () => void;
  #over = false;

  private constructor(ws: WebSocket, url: string) {
    this.#ws = ws;
    this.#url = url;
  }

  /** Opens the socket and waits for its first message (`from`, with the offset). */
  static open(url: string, dispatcher: Dispatcher, token: string | undefined, timeoutMs: number): Promise<ProcessSocket> {
    const headers: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {};
    const ws = new WebSocket(url, { dispatcher, headers } as ConstructorParameters<typeof WebSocket>[1]);
    ws.binaryType = "arraybuffer";
    const socket = new ProcessSocket(ws, url);
    return new Promise<ProcessSocket>((resolve, reject) => {
      const timer = setTimeout(() => {
        ws.close();
        reject(new ConnectionFailed(`attaching to ${url}: no answer in ${timeoutMs} ms`, { url }));
      }, timeoutMs);
      let first = true;
      ws.addEventListener("message", (ev) => {
        if (first) {
          first = false;
          clearTimeout(timer);
          const event = typeof ev.data === "string" ? (JSON.parse(ev.data) as T.ProcessOutputEvent) : undefined;
          if (event?.type !== "from") {
            ws.close();
            reject(new ProtocolError(`process socket: the first message is not \`from\``, { url }));
            return;
          }
          socket.offset = event.offset;
          socket.skipped = event.skipped;
          resolve(socket);
          return;
        }
        socket.#take(ev.data as string | ArrayBuffer);
      });
      ws.addEventListener("error", () => {
        if (first) {
          first = false;
          clearTimeout(timer);
          // The browser's WebSocket tells no status: the daemon's error answer (an
          // unknown sandbox or pid) is not seen here.
          reject(new ConnectionFailed(`attaching to ${url}: the daemon refused the WebSocket (is the sandbox and its process there?)`, { url }));
        }
      });
      ws.addEventListener("close", (ev) => {
        if (first) {
          first = false;
          clearTimeout(timer);
          reject(new ConnectionFailed(`attaching to ${url}: closed (${ev.code} ${ev.reason})`, { url }));
          return;
        }
        socket.#push(socket.process ? { done: true } : { error: new ProtocolError(`process socket: closed before the process ended (${ev.code} ${ev.reason})`, { url }) });
      });
    });
  }

  /** Bytes (a string as UTF-8) to the process's stdin: keys, on a terminal. */
  send(data: string | Uint8Array): void {
    this.#ws.send(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  /** The terminal's new size. */
  resize(rows: number, cols: number): void {
    this.#control({ type: "resize", rows, cols });
  }

  /** Ends the process's input (on a terminal: end-of-file). */
  closeStdin(): void {
    this.#control({ type: "close_stdin" });
  }

  /** `signal` to the process's group. */
  signal(signal: number): void {
    this.#control({ type: "signal", signal });
  }

  /** Detaches: the process runs on. */
  close(): void {
    this.#over = true;
    this.#ws.close(1000);
    this.#push({ done: true });
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputChunk> {
    for (;;) {
      const item = this.#items.shift();
      if (!item) {
        if (this.#over) return;
        await new Promise<void>((r) => (this.#wake = r));
        continue;
      }
      if ("chunk" in item) yield item.chunk;
      else if ("error" in item) throw item.error;
      else return;
    }
  }

  #control(c: T.ProcessControl): void {
    this.#ws.send(JSON.stringify(c));
  }

  #push(item: Item): void {
    if (this.#over && !("chunk" in item) && this.#items.some((i) => !("chunk" in i))) return;
    this.#items.push(item);
    if (!("chunk" in item)) this.#over = true;
    this.#wake?.();
    this.#wake = undefined;
  }

  #take(data: string | ArrayBuffer): void {
    if (typeof data !== "string") {
      const bytes = new Uint8Array(data);
      const stream = STREAMS[bytes[0] ?? 0];
      if (!stream) {
        this.#push({ error: new ProtocolError(`process socket: an output message of stream ${bytes[0]}`, { url: this.#url }) });
        return;
      }
      const chunk = { stream, offset: this.offset, data: bytes.subarray(1) };
      this.offset += chunk.data.length;
      this.#push({ chunk });
      return;
    }
    const event = JSON.parse(data) as T.ProcessOutputEvent;
    if (event.type === "from") {
      this.skipped += event.skipped;
      this.offset = event.offset;
    } else if (event.type === "end") {
      this.process = event.process;
    } else if (event.type === "error") {
      this.#push({ error: new ForkvmError(event.error, { url: this.#url }) });
    }
  }
}
