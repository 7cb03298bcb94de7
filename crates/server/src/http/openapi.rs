//! `GET /openapi.json`: the API as an OpenAPI 3.1 document, made while
//! the router is built.
//!
//! Every route is registered through [`Routes::add`] with its
//! [`Operation`]: the handler's own query, body and answer types, whose
//! JSON Schemas come from `schemars` (answers as they serialize, inputs as
//! they deserialize). So a route cannot be served undescribed, and a type
//! changed in a handler changes the document with it. The tests check the
//! document against the routes served and the answers sent.

use axum::Router;
use axum::routing::MethodRouter;
use rein_service::Service;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

/// The router being built and the document describing it.
pub(crate) struct Routes {
    router: Router<Service>,
    /// Answers' schemas: named ones land in `components/schemas`.
    answers: SchemaGenerator,
    /// Inputs' schemas, inlined (a type may read differently than it
    /// serializes, e.g. fields with defaults).
    inputs: SchemaGenerator,
    paths: Map<String, Value>,
    /// The paths of operations marked [`Operation::public`] (all `GET`):
    /// what the guard serves without a token.
    public: Vec<&'static str>,
}

impl Routes {
    pub(crate) fn new() -> Self {
        let answers = SchemaSettings::draft2020_12()
            .for_serialize()
            .with(|s| {
                s.definitions_path = "/components/schemas".into();
                s.meta_schema = None;
            })
            .into_generator();
        let inputs = SchemaSettings::draft2020_12()
            .for_deserialize()
            .with(|s| {
                s.inline_subschemas = true;
                s.meta_schema = None;
            })
            .into_generator();
        Self {
            router: Router::new(),
            answers,
            inputs,
            paths: Map::new(),
            public: Vec::new(),
        }
    }

    /// Serves `handler` at `GET path`, described by `describe`.
    pub(crate) fn get<H, T>(
        self,
        path: &'static str,
        handler: H,
        describe: impl FnOnce(Operation<'_>) -> Operation<'_>,
    ) -> Self
    where
        H: axum::handler::Handler<T, Service>,
        T: 'static,
    {
        self.add("get", path, axum::routing::get(handler), describe)
    }

    /// Serves `handler` at `POST path`, described by `describe`.
    pub(crate) fn post<H, T>(
        self,
        path: &'static str,
        handler: H,
        describe: impl FnOnce(Operation<'_>) -> Operation<'_>,
    ) -> Self
    where
        H: axum::handler::Handler<T, Service>,
        T: 'static,
    {
        self.add("post", path, axum::routing::post(handler), describe)
    }

    /// Serves `handler` at `DELETE path`, described by `describe`.
    pub(crate) fn delete<H, T>(
        self,
        path: &'static str,
        handler: H,
        describe: impl FnOnce(Operation<'_>) -> Operation<'_>,
    ) -> Self
    where
        H: axum::handler::Handler<T, Service>,
        T: 'static,
    {
        self.add("delete", path, axum::routing::delete(handler), describe)
    }

    /// Serves `handler` (a router for `method`) at `path` and describes it
    /// with what `describe` adds to its operation.
    fn add(
        mut self,
        method: &'static str,
        path: &'static str,
        handler: MethodRouter<Service>,
        describe: impl FnOnce(Operation<'_>) -> Operation<'_>,
    ) -> Self {
        let parameters: Vec<Value> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let operation = describe(Operation {
            routes: &mut self,
            value: json!({"parameters": parameters, "responses": {}}),
        })
        .value;
        if operation.get("security") == Some(&json!([])) {
            self.public.push(path);
        }
        let entry = self
            .paths
            .entry(path)
            .or_insert_with(|| Value::Object(Map::new()));
        entry[method] = operation;
        self.router = self.router.route(path, handler);
        self
    }

    /// The router, the document, and the paths served without a token.
    pub(crate) fn finish(mut self) -> (Router<Service>, Value, Vec<&'static str>) {
        let schemas = self.answers.take_definitions(true);
        let document = json!({
            "openapi": "3.1.0",
            "info": {
                "title": "Rein",
                "version": env!("CARGO_PKG_VERSION"),
                "description": "Rein's HTTP API: runs, their events, run control and approvals. docs/service.md explains each route.",
            },
            "paths": self.paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {
                    "bearer": {
                        "type": "http",
                        "scheme": "bearer",
                        "description": "A token of the deployment's server.auth (needed when it is set).",
                    },
                },
            },
            "security": [{"bearer": []}],
        });
        (self.router, document, self.public)
    }
}

/// One operation's description, built by [`Routes::add`]'s callback.
pub(crate) struct Operation<'a> {
    routes: &'a mut Routes,
    value: Value,
}

impl Operation<'_> {
    /// What it does, in one line.
    pub(crate) fn summary(mut self, text: &str) -> Self {
        self.value["summary"] = json!(text);
        self
    }

    /// Its query parameters: the fields of `Q`, none required.
    pub(crate) fn query<Q: JsonSchema>(mut self) -> Self {
        let schema = self.routes.inputs.root_schema_for::<Q>();
        let required: Vec<Value> = schema
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                let mut property = property.clone();
                let description = property
                    .as_object_mut()
                    .and_then(|p| p.remove("description"));
                // An absent parameter is how a query says "none": not null.
                if let Some(types) = property.get_mut("type").and_then(Value::as_array_mut) {
                    types.retain(|t| t != "null");
                    if let [only] = types.as_slice() {
                        property["type"] = only.clone();
                    }
                }
                let mut parameter = json!({
                    "name": name,
                    "in": "query",
                    "required": required.contains(&json!(name)),
                    "schema": property,
                });
                if let Some(description) = description {
                    parameter["description"] = description;
                }
                push(&mut self.value["parameters"], parameter);
            }
        }
        self
    }

    /// One more query parameter, described by hand (an extractor that is
    /// not a struct).
    pub(crate) fn query_flag(mut self, name: &str, description: &str) -> Self {
        push(
            &mut self.value["parameters"],
            json!({"name": name, "in": "query", "required": false,
                   "description": description, "schema": {"type": "boolean"}}),
        );
        self
    }

    /// One request header, described by hand.
    pub(crate) fn header(mut self, name: &str, description: &str) -> Self {
        push(
            &mut self.value["parameters"],
            json!({"name": name, "in": "header", "required": false,
                   "description": description, "schema": {"type": "string"}}),
        );
        self
    }

    /// Its JSON body: a `B`.
    pub(crate) fn body<B: JsonSchema>(mut self) -> Self {
        let schema = self.routes.inputs.root_schema_for::<B>();
        self.value["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": schema}},
        });
        self
    }

    /// An answer with a JSON `A`.
    pub(crate) fn answer<A: JsonSchema>(mut self, status: u16, description: &str) -> Self {
        let schema = self.routes.answers.subschema_for::<A>();
        self.value["responses"][status.to_string()] = json!({
            "description": description,
            "content": {"application/json": {"schema": schema}},
        });
        self
    }

    /// An answer of another content type (SSE, Prometheus text), as text.
    pub(crate) fn answer_text(
        mut self,
        status: u16,
        content_type: &str,
        description: &str,
    ) -> Self {
        self.value["responses"][status.to_string()] = json!({
            "description": description,
            "content": {content_type: {"schema": {"type": "string"}}},
        });
        self
    }

    /// An answer with no body.
    pub(crate) fn answer_empty(mut self, status: u16, description: &str) -> Self {
        self.value["responses"][status.to_string()] = json!({"description": description});
        self
    }

    /// Refusals: each status with the error codes it carries.
    pub(crate) fn refusals(mut self, refusals: &[(u16, &str)]) -> Self {
        let schema = self
            .routes
            .answers
            .subschema_for::<super::error::ErrorBody>();
        for (status, codes) in refusals {
            self.value["responses"][status.to_string()] = json!({
                "description": format!("refused: {codes}"),
                "content": {"application/json": {"schema": schema}},
            });
        }
        self
    }

    /// Served without a token, also when `server.auth` is set (a `GET`
    /// that holds no data: the guard reads this mark).
    pub(crate) fn public(mut self) -> Self {
        self.value["security"] = json!([]);
        self
    }
}

fn push(list: &mut Value, item: Value) {
    if let Value::Array(items) = list {
        items.push(item);
    }
}
