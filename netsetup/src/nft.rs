//! nftables through libnftables' JSON API (`libnftables.so.1`, loaded with `dlopen` at run
//! time so building needs no C library). The library talks nf_tables netlink itself; no `nft`
//! process is started. Commands act in the network namespace of the calling thread.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// Errors of the nftables layer.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("libnftables is not available ({0}); install the libnftables1 package")]
    Load(String),
    #[error("nft_ctx_new failed")]
    Context,
    #[error("nftables command failed: {message} (command: {command})")]
    Command { message: String, command: String },
    #[error("nftables command contains a NUL byte")]
    Nul,
    #[error("nftables output is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

type NftCtxNew = unsafe extern "C" fn(c_uint) -> *mut c_void;
type NftCtxFree = unsafe extern "C" fn(*mut c_void);
type NftSetFlags = unsafe extern "C" fn(*mut c_void, c_uint);
type NftBuffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type NftGetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type NftRun = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

const NFT_CTX_DEFAULT: c_uint = 0;
const NFT_CTX_OUTPUT_JSON: c_uint = 1 << 4;

struct Api {
    ctx_new: NftCtxNew,
    ctx_free: NftCtxFree,
    set_flags: NftSetFlags,
    buffer_output: NftBuffer,
    buffer_error: NftBuffer,
    get_output: NftGetBuffer,
    get_error: NftGetBuffer,
    run: NftRun,
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a pointer to a NUL-terminated thread-local string that
    // stays valid until the next dl* call on this thread; we copy it at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn load() -> Result<&'static Api, NftError> {
    use std::sync::OnceLock;
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let mut handle = std::ptr::null_mut();
        for name in [c"libnftables.so.1", c"libnftables.so"] {
            // SAFETY: dlopen with a valid NUL-terminated name; the handle is never closed, so
            // the function pointers taken below stay valid for the life of the process.
            handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                break;
            }
        }
        if handle.is_null() {
            return Err(dlerror_string());
        }
        let sym = |name: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: valid handle and NUL-terminated symbol name.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(format!("symbol {name:?} missing: {}", dlerror_string()))
            } else {
                Ok(p)
            }
        };
        // SAFETY (all transmutes below): each symbol is the libnftables function of that name,
        // whose C prototype (libnftables.h, stable since 0.9) matches the Rust type it is
        // transmuted to; the pointers are non-null and the library stays loaded.
        unsafe {
            Ok(Api {
                ctx_new: std::mem::transmute::<*mut c_void, NftCtxNew>(sym(c"nft_ctx_new")?),
                ctx_free: std::mem::transmute::<*mut c_void, NftCtxFree>(sym(c"nft_ctx_free")?),
                set_flags: std::mem::transmute::<*mut c_void, NftSetFlags>(sym(
                    c"nft_ctx_output_set_flags",
                )?),
                buffer_output: std::mem::transmute::<*mut c_void, NftBuffer>(sym(
                    c"nft_ctx_buffer_output",
                )?),
                buffer_error: std::mem::transmute::<*mut c_void, NftBuffer>(sym(
                    c"nft_ctx_buffer_error",
                )?),
                get_output: std::mem::transmute::<*mut c_void, NftGetBuffer>(sym(
                    c"nft_ctx_get_output_buffer",
                )?),
                get_error: std::mem::transmute::<*mut c_void, NftGetBuffer>(sym(
                    c"nft_ctx_get_error_buffer",
                )?),
                run: std::mem::transmute::<*mut c_void, NftRun>(sym(c"nft_run_cmd_from_buffer")?),
            })
        }
    })
    .as_ref()
    .map_err(|e| NftError::Load(e.clone()))
}

/// Whether libnftables can be loaded on this machine.
pub fn available() -> bool {
    load().is_ok()
}

/// Runs one JSON command document (`{"nftables": [...]}`) and returns libnftables' JSON output
/// (empty for commands that print nothing).
pub fn run_json(doc: &serde_json::Value) -> Result<String, NftError> {
    let api = load()?;
    let text = doc.to_string();
    let cmd = CString::new(text.clone()).map_err(|_| NftError::Nul)?;
    // SAFETY: nft_ctx_new has no preconditions; NULL is handled.
    let ctx = unsafe { (api.ctx_new)(NFT_CTX_DEFAULT) };
    if ctx.is_null() {
        return Err(NftError::Context);
    }
    struct Ctx<'a>(*mut c_void, &'a Api);
    impl Drop for Ctx<'_> {
        fn drop(&mut self) {
            // SAFETY: the context came from nft_ctx_new and is freed once, here.
            unsafe { (self.1.ctx_free)(self.0) }
        }
    }
    let ctx = Ctx(ctx, api);
    // SAFETY: `ctx.0` is a live context; the buffers returned by the getters are owned by it
    // and copied before it is freed; `cmd` is NUL-terminated and outlives the call.
    unsafe {
        (api.set_flags)(ctx.0, NFT_CTX_OUTPUT_JSON);
        (api.buffer_output)(ctx.0);
        (api.buffer_error)(ctx.0);
        let rc = (api.run)(ctx.0, cmd.as_ptr());
        let cstr = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        if rc != 0 {
            return Err(NftError::Command {
                message: cstr((api.get_error)(ctx.0)).trim().to_string(),
                command: text,
            });
        }
        Ok(cstr((api.get_output)(ctx.0)))
    }
}

/// The ruleset of the calling thread's network namespace, as libnftables' JSON.
pub fn list_ruleset() -> Result<serde_json::Value, NftError> {
    let out = run_json(&serde_json::json!({"nftables": [{"list": {"ruleset": null}}]}))?;
    Ok(serde_json::from_str(&out)?)
}

/// Names of the `ip` family tables in the calling thread's network namespace.
pub fn ip_tables() -> Result<Vec<String>, NftError> {
    let v = list_ruleset()?;
    Ok(v["nftables"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["table"]["family"] == "ip")
                .filter_map(|e| e["table"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}
