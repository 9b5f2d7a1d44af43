//! The virtio-mmio register layout (virtio 1.2 section 4.2.2): offsets, the identification
//! values and the register names for exit statistics.

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
pub const REG_VENDOR_ID: u64 = 0x00c;
pub const REG_DEVICE_FEATURES: u64 = 0x010;
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
pub const REG_DRIVER_FEATURES: u64 = 0x020;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
pub const REG_QUEUE_SEL: u64 = 0x030;
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
pub const REG_QUEUE_NUM: u64 = 0x038;
pub const REG_QUEUE_READY: u64 = 0x044;
/// Queue notify register; KVM ioeventfds sit here (datamatch = queue index).
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
pub const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
pub const REG_QUEUE_DRIVER_LOW: u64 = 0x090;
pub const REG_QUEUE_DRIVER_HIGH: u64 = 0x094;
pub const REG_QUEUE_DEVICE_LOW: u64 = 0x0a0;
pub const REG_QUEUE_DEVICE_HIGH: u64 = 0x0a4;
pub const REG_SHM_SEL: u64 = 0x0ac;
pub const REG_SHM_LEN_LOW: u64 = 0x0b0;
pub const REG_SHM_LEN_HIGH: u64 = 0x0b4;
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
/// Device-specific configuration space starts here.
pub const REG_CONFIG: u64 = 0x100;

/// "virt" in little endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
pub const MMIO_VERSION: u32 = 2;
/// Vendor id reported to the guest ("MV", microvirt).
pub const VENDOR_ID: u32 = 0x4d56;

/// The name of the virtio-mmio register at `offset` (exit statistics).
pub fn register_name(offset: u64) -> Option<&'static str> {
    Some(match offset {
        REG_MAGIC => "MagicValue",
        REG_VERSION => "Version",
        REG_DEVICE_ID => "DeviceID",
        REG_VENDOR_ID => "VendorID",
        REG_DEVICE_FEATURES => "DeviceFeatures",
        REG_DEVICE_FEATURES_SEL => "DeviceFeaturesSel",
        REG_DRIVER_FEATURES => "DriverFeatures",
        REG_DRIVER_FEATURES_SEL => "DriverFeaturesSel",
        REG_QUEUE_SEL => "QueueSel",
        REG_QUEUE_NUM_MAX => "QueueNumMax",
        REG_QUEUE_NUM => "QueueNum",
        REG_QUEUE_READY => "QueueReady",
        REG_QUEUE_NOTIFY => "QueueNotify",
        REG_INTERRUPT_STATUS => "InterruptStatus",
        REG_INTERRUPT_ACK => "InterruptACK",
        REG_STATUS => "Status",
        REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH => "QueueDesc",
        REG_QUEUE_DRIVER_LOW | REG_QUEUE_DRIVER_HIGH => "QueueDriver",
        REG_QUEUE_DEVICE_LOW | REG_QUEUE_DEVICE_HIGH => "QueueDevice",
        REG_SHM_SEL | REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH => "SHM",
        REG_CONFIG_GENERATION => "ConfigGeneration",
        o if o >= REG_CONFIG => "config",
        _ => return None,
    })
}
