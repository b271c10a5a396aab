//! The MCP server handler: its identity and instructions, the tools (routed by
//! `rmcp`'s macros to [`crate::tools`]) and the resources ([`crate::resources`]).

use crate::resources;
use crate::tools::{describe, ForkvmMcp};
use rmcp::model::{
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ResourceContents, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

const INSTRUCTIONS: &str = "forkvm runs code in microVM sandboxes that fork in milliseconds. \
Typical use: `list_snapshots` (or `create_snapshot` from the `python` template), `spawn` a sandbox from a tag, \
`exec` commands or `eval` Python in it, `read_file`/`write_file`. To try several approaches from the same \
state, `fork` the sandbox n times (or `branch` it to a tag and `spawn` from that later), then `kill` the ones \
you no longer need. Resources: each sandbox's console log and file tree.";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ForkvmMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("forkvm", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let sandboxes = self
            .daemon
            .call(|c| c.list_sandboxes())
            .await
            .map_err(|e| ErrorData::internal_error(format!("listing sandboxes: {}", describe(&e)), None))?;
        let live = sandboxes.iter().filter(|s| s.state != "archived");
        Ok(ListResourcesResult::with_all_items(live.flat_map(|s| resources::of_sandbox(&s.id)).collect()))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(resources::templates()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let text = resources::read(&self.daemon, &request.uri).await?;
        let contents = ResourceContents::text(text, request.uri).with_mime_type("text/plain");
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}
