/**
 * forkvm's TypeScript SDK: `Controller` (every REST route) and an E2B-shaped `Sandbox`.
 * docs/sdks.md compares it with the Python SDK, the CLI and E2B's.
 */

export { Controller, type ControllerOptions, type ExecOptions, type BodyLike } from "./controller.js";
export { Sandbox, Commands, Files, type CommandResult, type CreateOptions, type RunOptions, type SandboxOptions, type OutputCallback } from "./sandbox.js";
export * from "./errors.js";
export { resolveEndpoint, resolveToken, defaultSocketPath, defaultRunRoot, quoteSegment, type Endpoint, type TlsOptions } from "./transport.js";
export type * from "./types.js";
