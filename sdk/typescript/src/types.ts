/**
 * The REST API's shapes, named: aliases of the types `openapi-typescript` generates from
 * docs/openapi.json into `schema.d.ts` (`npm run gen`), never a hand copy.
 */

import type { components, operations } from "./schema.js";

type S = components["schemas"];

export type ErrorBody = S["ErrorBody"];
export type Health = S["Health"];
export type VersionInfo = S["VersionInfo"];
export type CreateSnapshotRequest = S["CreateSnapshotRequest"];
export type DefaultLimits = S["DefaultLimits"];
export type SnapshotInfo = S["SnapshotInfo"];
export type SnapshotInfoDetail = S["SnapshotInfoDetail"];
export type CompactSnapshotRequest = S["CompactSnapshotRequest"];
export type UnpackResponse = S["UnpackResponse"];
export type CreateSandboxRequest = S["CreateSandboxRequest"];
export type ForkSandboxRequest = S["ForkSandboxRequest"];
export type SandboxInfo = S["SandboxInfo"];
export type BranchSandboxRequest = S["BranchSandboxRequest"];
export type ExecRequest = S["ExecRequest"];
export type ExecResponse = S["ExecResponse"];
export type ExecEventStdout = S["ExecEventStdout"];
export type ExecEventStderr = S["ExecEventStderr"];
export type ExecEventExit = S["ExecEventExit"];
export type ExecEventError = S["ExecEventError"];
export type ExecEvent = S["ExecEvent"];
export type WatchEvent = S["WatchEvent"];
export type TemplateImportEvent = S["TemplateImportEvent"];

/** `POST /v1/templates/oci`'s query: the template's name and what to add to the image. */
export type ImportOciQuery = operations["import_oci_template"]["parameters"]["query"];
export type TemplateBuildEvent = S["TemplateBuildEvent"];
export type TemplateBuildReport = S["TemplateBuildReport"];
export type TemplateBuildStep = S["TemplateBuildStep"];
/** `POST /v1/templates/build`'s query: the tag, the Dockerfile's path, ARG values as JSON. */
export type BuildTemplateQuery = operations["build_template"]["parameters"]["query"];
export type EvalRequest = S["EvalRequest"];
export type EvalResponse = S["EvalResponse"];
export type FileEntry = S["FileEntry"];
export type FileWritten = S["FileWritten"];
export type FileChecksum = S["FileChecksum"];
export type Lineage = S["Lineage"];
export type LineageNode = S["LineageNode"];
export type LineageEdge = S["LineageEdge"];
export type SandboxUsage = S["SandboxUsage"];
export type CreateCheckpointRequest = S["CreateCheckpointRequest"];
export type CheckpointPolicy = S["CheckpointPolicy"];
export type CheckpointInfo = S["CheckpointInfo"];
export type CheckpointList = S["CheckpointList"];
export type RewindRequest = S["RewindRequest"];
export type RewindReport = S["RewindReport"];
export type PruneBuildsRequest = S["PruneBuildsRequest"];
export type PruneBuildsReport = S["PruneBuildsReport"];
export type Pong = S["Pong"];
export type DiskSnapshotRequest = S["DiskSnapshotRequest"];
export type DiskSnapshotReport = S["DiskSnapshotReport"];
export type DiskSnapshotDisk = S["DiskSnapshotDisk"];
export type DiskSnapshotInfo = S["DiskSnapshotInfo"];
export type LastDiskSnapshot = S["LastDiskSnapshot"];
export type ArchiveReport = S["ArchiveReport"];
export type RestoreRequest = S["RestoreRequest"];
export type DiskForkRequest = S["DiskForkRequest"];
export type SetTtlRequest = S["SetTtlRequest"];
export type VmmJail = S["VmmJail"];
export type IoLimits = S["IoLimits"];
export type NetworkPolicy = S["NetworkPolicy"];
export type ExposeRequest = S["ExposeRequest"];
export type ExposedPort = S["ExposedPort"];
export type CreateWorkspaceRequest = S["CreateWorkspaceRequest"];
export type SuspendWorkspaceRequest = S["SuspendWorkspaceRequest"];
export type WorkspaceInfo = S["WorkspaceInfo"];
export type CreateVolumeRequest = S["CreateVolumeRequest"];
export type SnapshotVolumeRequest = S["SnapshotVolumeRequest"];
export type VolumeInfo = S["VolumeInfo"];
export type RemoteInfo = S["RemoteInfo"];
export type PushRequest = S["PushRequest"];
export type PullRequest = S["PullRequest"];
export type CollectRequest = S["CollectRequest"];
export type PushReport = S["PushReport"];
export type PullReport = S["PullReport"];
export type GcReport = S["GcReport"];
export type LockKind = S["LockKind"];
export type LockInfo = S["LockInfo"];
export type VolumeMount = S["VolumeMount"];
export type VolumeMode = S["VolumeMode"];
export type TerminalSize = S["TerminalSize"];
export type StartProcessRequest = S["StartProcessRequest"];
export type ProcessInfo = S["ProcessInfo"];
export type ProcessExit = S["ProcessExit"];
export type ProcessOutputEvent = S["ProcessOutputEvent"];
export type ProcessInputWritten = S["ProcessInputWritten"];
export type ProcessControl = S["ProcessControl"];
