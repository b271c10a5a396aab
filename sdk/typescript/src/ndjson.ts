/**
 * NDJSON lines out of a byte stream, each parsed whole: the network cuts a body wherever
 * it likes (mid-line, mid-character), so bytes are buffered up to each newline.
 */

import { ProtocolError } from "./errors.js";

/** Longest line accepted (an output chunk is far smaller; this bounds memory). */
export const MAX_LINE_BYTES = 64 * 1024 * 1024;

function parseLine(bytes: Uint8Array): Record<string, unknown> | undefined {
  const text = new TextDecoder().decode(bytes);
  if (!text.trim()) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new ProtocolError(`exec stream: bad NDJSON line ${JSON.stringify(text.slice(0, 200))}: ${String(e)}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ProtocolError(`exec stream: a line is not a JSON object: ${JSON.stringify(text.slice(0, 200))}`);
  }
  return value as Record<string, unknown>;
}

/** The objects of `body`'s lines, as they complete. */
export async function* ndjson(body: AsyncIterable<Uint8Array>): AsyncGenerator<Record<string, unknown>> {
  let buf = new Uint8Array(0);
  for await (const chunk of body) {
    const joined = new Uint8Array(buf.length + chunk.length);
    joined.set(buf);
    joined.set(chunk, buf.length);
    buf = joined;
    let nl: number;
    while ((nl = buf.indexOf(10)) >= 0) {
      const obj = parseLine(buf.subarray(0, nl));
      buf = buf.slice(nl + 1);
      if (obj) yield obj;
    }
    if (buf.length > MAX_LINE_BYTES) throw new ProtocolError(`exec stream: a line is longer than ${MAX_LINE_BYTES} bytes`);
  }
  const last = parseLine(buf);
  if (last) yield last;
}
