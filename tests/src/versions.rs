//! Model versions registered as a person does it: the artifact and its
//! signed manifest uploaded, then the version posted naming both.

use edgeloop_models::manifest::{Manifest, ManifestKey};
use serde_json::{json, Value};

use crate::ControlPlane;

impl ControlPlane {
    /// `manifest` signed with `key` and registered with `artifact` as the
    /// manifest's model and version (the model exists already); the
    /// version as the API answers its 201.
    pub async fn register_signed(
        &self,
        key: &ManifestKey,
        manifest: Manifest,
        artifact: &[u8],
    ) -> Value {
        let (model, version) = (manifest.name.clone(), manifest.version.clone());
        let signed = key.sign(manifest).unwrap().to_json_pretty().unwrap();
        self.register_version(&model, &version, artifact, signed.as_bytes())
            .await
    }

    /// `artifact` and its signed manifest (`signed`, the file's bytes)
    /// uploaded and registered as `model`'s `version`; the version as the
    /// API answers its 201.
    pub async fn register_version(
        &self,
        model: &str,
        version: &str,
        artifact: &[u8],
        signed: &[u8],
    ) -> Value {
        let artifact = self.upload(artifact).await;
        let manifest = self.upload(signed).await;
        let (status, body) = self
            .api()
            .post(
                &format!("/api/v1/models/{model}/versions"),
                json!({"version": version, "artifact_digest": artifact.to_string(),
                       "manifest_digest": manifest.to_string()}),
            )
            .await;
        assert_eq!(status, 201, "{model} {version}: {body}");
        body
    }
}
