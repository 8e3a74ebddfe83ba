// reference/model/hooks.h: the component table is the one list of names (in enum order, each name once,
// each kind with its hook), and docs/architecture.md lists every name.
#include "reference/model/hooks.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace dsv41::reference::model {
namespace {

TEST(ComponentTable, InEnumOrderWithUniqueNames) {
  const std::vector<ComponentInfo>& table = component_table();
  ASSERT_GT(table.size(), 20u);
  std::set<std::string> names;
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(table[i].id), i) << table[i].name;
    EXPECT_TRUE(names.insert(table[i].name).second) << "duplicate name " << table[i].name;
    EXPECT_EQ(component_from_name(table[i].name), table[i].id);
    EXPECT_STREQ(name(table[i].id), table[i].name);
  }
  EXPECT_FALSE(component_from_name("swa").has_value());
  EXPECT_FALSE(component_from_name("cache.swa").has_value()) << "the window cache is cache.window_kv";
  EXPECT_EQ(component_info(Component::kTopk).kind, ComponentKind::kIndex);
  EXPECT_EQ(component_info(Component::kCandidates).kind, ComponentKind::kMask);
  EXPECT_EQ(component_info(Component::kHcFfnComb).type, ComponentType::kFp32);
  EXPECT_EQ(component_info(Component::kCacheCompressedKv).kind, ComponentKind::kCache);
}

TEST(ComponentTable, TheArchitecturePageListsEveryName) {
  std::ifstream in(std::string(DSV41_SOURCE_DIR) + "/docs/architecture.md");
  ASSERT_TRUE(in) << "docs/architecture.md";
  std::stringstream text;
  text << in.rdbuf();
  for (const ComponentInfo& c : component_table()) {
    EXPECT_NE(text.str().find(std::string("`") + c.name + "`"), std::string::npos)
        << "docs/architecture.md does not list `" << c.name << "`";
  }
}

TEST(ForwardHooks, AReplacementMustKeepTheShape) {
  ForwardHooks h;
  h.tensor = [](Component, int, Tensor<float>& v) { v = Tensor<float>({3}, "other"); };
  Tensor<float> x({2, 2}, "x");
  EXPECT_THROW(h.on(Component::kAttnOut, 1, x), Error);
  EXPECT_TRUE(h.any());
  EXPECT_FALSE(ForwardHooks{}.any());
}

}  // namespace
}  // namespace dsv41::reference::model
