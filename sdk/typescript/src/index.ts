/**
 * forkvm's TypeScript SDK: `Controller` (every REST route) and an E2B-shaped `Sandbox`.
 * docs/sdks.md compares it with the Python SDK, the CLI and E2B's.
 */

export { Controller, type ControllerOptions, type ExecOptions, type BodyLike } from "./controller.js";
export { Sandbox, Checkpoints, Commands, Files, Pty, type CommandResult, type CreateOptions, type RunOptions, type SandboxOptions, type OutputCallback } from "./sandbox.js";
export * from "./errors.js";
export { ProcessSocket, type OutputChunk } from "./attach.js";
export { ProcessHandle, type StartOptions } from "./process_handle.js";
export { resolveEndpoint, resolveToken, defaultSocketPath, defaultRunRoot, quoteSegment, type Endpoint, type TlsOptions } from "./transport.js";
export type * from "./types.js";
